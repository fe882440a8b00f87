"""Megatron's training log, read (confirm.megatron_log) on the format-true samples in data/ (README.md: written
from training_log's format strings, not GPU recordings)."""
from pathlib import Path

from tptune.confirm.megatron_log import error_lines, failure_kind, median_ms, parse_iterations

DATA = Path(__file__).parent / "data"


def test_a_complete_launch_gives_every_iteration_its_time_loss_and_grad_norm():
    its = parse_iterations((DATA / "megatron_ok.log").read_text())
    assert [i.iteration for i in its] == list(range(1, 31)) and {i.of for i in its} == {30}
    assert its[0].ms == 3116.6 and its[1].ms == 512.0            # the first iteration carries the warm-up
    assert its[0].loss == 11.88702 and its[0].grad_norm == 3.381 and its[0].skipped == 0 and its[0].nan == 0
    times = sorted(i.ms for i in its if i.iteration >= 10)
    assert median_ms(its, 10) == times[len(times) // 2]           # 21 iterations: the middle one
    assert median_ms(its, 31) is None
    assert failure_kind((DATA / "megatron_ok.log").read_text()) is None


def test_an_oom_is_named_and_its_first_error_lines_kept_once():
    text = (DATA / "megatron_oom.log").read_text()
    assert failure_kind(text) == "oom"
    lines = error_lines(text)
    assert lines[0] == "Traceback (most recent call last):"
    oom = [x for x in lines if "CUDA out of memory" in x]
    assert len(oom) == 2 and all(not x.startswith("[rank") for x in oom)   # two ranks' messages, prefix gone
    assert len(parse_iterations(text)) == 3


def test_a_userbuffers_assert_is_named():
    text = (DATA / "megatron_userbuffers.log").read_text()
    assert failure_kind(text) == "userbuffers"
    assert any("Assertion failed: num_splits" in x for x in error_lines(text))
    assert sum("Assertion failed" in x for x in error_lines(text)) == 1     # rank 1 and 3 say the same: once
    assert parse_iterations(text) == []
