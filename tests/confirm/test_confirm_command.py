"""The Megatron-LM command a confirm launches, for committed GPU runs: every option against the committed snapshot
of Megatron-LM 0.19's option names (src/tptune/data/megatron_lm_args.txt, scripts/snapshot_megatron_args.py);
and through Megatron's own parse_args/validate_args where megatron-core imports.

megatron-core 0.19.2 is not a dependency of the test environment: it says Python >= 3.12 (this venv and CI run
3.11; its cp311 wheel's parser runs here) and importing megatron.training pulls in triton, which the CPU torch wheel
lacks. scripts/fetch_megatron_lm.sh unpacks both into .cache/megatron-lm (CI runs it), which the check then
uses; TPTUNE_MEGATRON_PATH (os.pathsep-separated folders) points it elsewhere."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from tptune.confirm.command import entry_args, launch_env, merged, model_args
from tptune.confirm.settings import confirm_settings
from tptune.confirm.stage import model_config
from tptune.records.run_dir import RunDir

SNAPSHOT = ROOT / "src" / "tptune" / "data" / "megatron_lm_args.txt"
RUNS = {"bf16 dense": "results/tp24-llama3-70b-h200x4/rep1", "fp8 dense": "results/fp8-llama3-70b-h200x4-tp4",
        "bf16 MoE": "results/qwen3-30b-a3b-h200x4-tp4"}
FETCHED = ROOT / ".cache" / "megatron-lm"     # scripts/fetch_megatron_lm.sh
MEGATRON = os.environ.get("TPTUNE_MEGATRON_PATH") or (str(FETCHED) if (FETCHED / ".complete").is_file() else None)


def _options() -> dict[str, str]:
    """Megatron-LM 0.19's options, and tptune's training entry's own (confirm.command.add_tptune_args)."""
    rows = [x.split() for x in SNAPSHOT.read_text().splitlines() if x and not x.startswith("#")]
    return {**{o: k for o, k in rows}, "--tptune-timing": "value", "--tptune-data-seed": "value",
            "--tptune-packed": "value"}


def _copy(run: str, tmp_path: Path) -> RunDir:
    dst = tmp_path / Path(run).name
    shutil.copytree(ROOT / run, dst, ignore=shutil.ignore_patterns("sessions", "analysis", "search", "figures",
                                                                   "logs", "*.parquet", "*.csv"))
    return RunDir(dst)


def _argvs(run: RunDir) -> dict[str, list[str]]:
    tp = max(int(k) for k in json.loads(run.decisions_json.read_text())["meta"]["files"]["sets"])
    base = model_args(model_config(run), layers=2, tp=tp, iters=30, micro_batches=4, seed=1234)
    return {s.name: merged(base, s.flags) + entry_args(seed=1234) for s in confirm_settings(run, tp)}


@pytest.mark.parametrize("kind", RUNS)
def test_every_option_is_megatron_lms_with_its_value_or_none(kind, tmp_path):
    opts = _options()
    assert len(opts) > 800 and opts["--tp-comm-overlap-cfg"] == "value" and opts["--swiglu"] == "switch"
    for name, argv in _argvs(_copy(RUNS[kind], tmp_path)).items():
        assert argv.count("--sequence-parallel") == 1, name
        for i, tok in enumerate(argv):
            if not tok.startswith("--"):
                assert argv[i - 1].startswith("--") and opts[argv[i - 1]] == "value", (name, argv[i - 1], tok)
                continue
            assert tok in opts, f"{name}: {tok} is no Megatron-LM 0.19 option"
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            assert has_value == (opts[tok] == "value"), (name, tok)


def test_the_set_runs_as_written_and_the_preset_under_megatrons_default_switches(tmp_path):
    run = _copy(RUNS["bf16 dense"], tmp_path)
    argv = _argvs(run)
    written = [x for x in (run.root / "megatron_flags.tp4.txt").read_text().split() if x.startswith("--")]
    assert [x for x in argv["set"] if x.startswith("--tp-comm")] == [x for x in written if x.startswith("--tp-comm")]
    cfg = argv["set"][argv["set"].index("--tp-comm-overlap-cfg") + 1]
    assert cfg == str((run.root / "tp_comm_overlap_cfg.tp4.yaml").resolve())
    # nvidia_bf16_tp2 ran the TP 4 block fastest of the NVIDIA presets (41.35 ms vs te 41.48, nemo_tp4 41.61)
    p = argv["preset"]
    assert [x for x in p if x.startswith("--tp-comm")] == ["--tp-comm-overlap", "--tp-comm-overlap-cfg"]
    assert p[p.index("--tp-comm-overlap-cfg") + 1] == str((run.confirm_dir / "nvidia_bf16_tp2.yaml").resolve())
    assert not any(x.startswith("--tp-comm") for x in argv["none"])


@pytest.mark.skipif(not MEGATRON, reason="megatron-core 0.19.2 is not unpacked here: bash scripts/fetch_megatron_lm.sh "
                                         "(CI runs it), or set TPTUNE_MEGATRON_PATH (module doc)")
@pytest.mark.parametrize("kind", RUNS)
def test_megatrons_own_parse_args_and_validate_args_take_every_setting(kind, tmp_path):
    run = _copy(RUNS[kind], tmp_path)
    argvs = _argvs(run)
    listing = tmp_path / "argvs.json"
    listing.write_text(json.dumps(list(argvs.values())))
    env = {**launch_env(dict(os.environ), tmp_path), "RANK": "0", "LOCAL_RANK": "0",
           "PYTHONPATH": os.pathsep.join([MEGATRON, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("megatron_validate.py")), str(listing)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{kind}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    parsed = [json.loads(x[7:]) for x in p.stdout.splitlines() if x.startswith("PARSED ")]
    assert len(parsed) == len(argvs)
    for (name, argv), got in zip(argvs.items(), parsed):
        tp = argv[argv.index("--tensor-model-parallel-size") + 1]
        assert got["tensor_model_parallel_size"] == int(tp) and got["data_parallel_size"] == 1
        assert got["sequence_parallel"] and got["num_layers"] == 2 and got["global_batch_size"] == 4
        assert got["gradient_accumulation_fusion"] is False and got["mock_data"] and got["timing_log_level"] == 0
        assert got["tp_comm_overlap"] == (name != "none")
        assert got["tptune_timing"] == "{workdir}/timing.json" and got["tptune_data_seed"] == 1234
        if name == "set":   # Megatron reads the switches decisions.json says the set was written with
            written = json.loads(run.decisions_json.read_text())["meta"]["files"]["sets"][tp]["switches"]
            assert {k: got[k] for k in written if k in got} == {k: v for k, v in written.items() if k in got}
        if name == "preset":
            assert got["tp_comm_bulk_wgrad"] and got["tp_comm_bulk_dgrad"] and not got["tp_comm_overlap_rs_dgrad"]
        assert (got["fp8"] is not None) == ("fp8" in kind) and (got["num_experts"] is not None) == ("MoE" in kind)
