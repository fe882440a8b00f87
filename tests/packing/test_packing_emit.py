"""Each framework's settings for T, checked against the option names of its own parser or config
(tptune.packing.emit; the snapshots name their source commits)."""
import numpy as np
import pytest

from tptune.packing import emit, rules

SWITCHES = ["--tp-comm-overlap", "--tp-comm-overlap-cfg", "old.yaml", "--disable-tp-comm-bulk-dgrad"]


def test_every_framework_uses_only_options_it_knows():
    sets = emit.all_settings(8192, 4, "tp_comm_overlap_cfg.yaml", SWITCHES,
                             {"tp_comm_bulk_dgrad": False, "tp_comm_overlap_rs_dgrad": True})
    assert [s.framework for s in sets] == list(emit.FRAMEWORKS)
    for s in sets:
        assert emit.option_problems(s) == [], s.framework
    lm, rl, sl, vl = sets
    assert lm.command_line() == ("--seq-length 8192 --micro-batch-size 1 --sequence-parallel --tp-comm-overlap "
                                 "--tp-comm-overlap-cfg tp_comm_overlap_cfg.yaml --disable-tp-comm-bulk-dgrad")
    assert rl.args[:3] == ("--rl-use-sequence-packing", "--rl-sequence-packing-max-sequences-per-bin", "50")
    assert "--data-pad-size-multiplier 2048" in sl.command_line() and "--max-tokens-per-gpu 8192" in sl.command_line()
    assert (lm.ready, rl.ready, sl.ready, vl.ready) == (True, True, True, False)
    assert "initialize_ub" in vl.needs[0] and "Karmarkar-Karp" in vl.needs[1]
    assert vl.overrides["actor_rollout_ref.actor.megatron.override_transformer_config.tp_comm_overlap"] is True
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192" in vl.command_line()


def test_unknown_options_are_named():
    bad = emit.FrameworkSettings("slime", 8192, ("--max-token-per-gpu", "8192", "--tp-comm-overlap", "1"))
    assert emit.option_problems(bad) == ["slime --max-token-per-gpu: not an option of its parser",
                                         "slime --tp-comm-overlap: a switch, given '1'"]
    v = emit.verl(8192, 2, {"tp_comm_overlap_typo": True})
    assert emit.option_problems(v) == [
        "veRL actor_rollout_ref.actor.megatron.override_transformer_config.tp_comm_overlap_typo: tp_comm_overlap_typo "
        "is not a TransformerConfig field"]
    with pytest.raises(ValueError, match="not a multiple of TP"):
        emit.slime(8190, 4, "c.yaml")


def test_slime_set_up_for_t_pads_every_micro_batch_to_exactly_t():
    # --max-tokens-per-gpu T keeps a micro-batch at most T tokens; --data-pad-size-multiplier T / TP pads it to
    # a multiple of TP x T / TP = T: exactly T, the one count the userbuffers take
    rng = np.random.default_rng(5)
    T, tp = 8192, 4
    for row in rules.draw_steps(rng.integers(50, T + 1, 3000), 64, 1):
        step = rules.slime(row.tolist(), T, tp, pad_multiplier=T // tp)
        assert {mb.padded for mb in step.micro_batches} == {T}
