"""A Hugging Face config.json gets a name of its own (issue 54 item 9): every such file is called config.json, so
its file name named every model `config` and two models shared one run folder. The name comes from
`_name_or_path`, else the folder holding the file (a Hugging Face cache snapshot: its repository's), else the
architecture."""
from __future__ import annotations

import json
import shutil

from conftest import FIXTURES, ROOT

from tptune.measure.preflight import resolve_here
from tptune.model.spec import load_model
from tptune.settings.resolve import load_config_files

HF = FIXTURES / "hf"
WL = {"seq_length": 4096}


def _placed(tmp_path, fixture, *folders, **extra):
    d = tmp_path.joinpath(*folders)
    d.mkdir(parents=True)
    raw = {**json.loads((HF / fixture).read_text()), **extra}
    (d / "config.json").write_text(json.dumps(raw))
    return d / "config.json"


def test_two_models_in_config_json_files_get_their_folders_names_and_two_run_folders(tmp_path):
    a = _placed(tmp_path, "llama-3.2-1b.config.json", "Llama-3.2-1B")
    b = _placed(tmp_path, "qwen3-0.6b.config.json", "Qwen3-0.6B")
    assert load_model(a, WL).model.name == "Llama-3.2-1B" and load_model(b, WL).model.name == "Qwen3-0.6B"
    base = load_config_files(ROOT / "config" / "config.yaml")
    runs = {resolve_here({**base, "model": str(p), "workload": WL, "backend": "torch"}, base_dir=ROOT,
                         check_hardware=False).run for p in (a, b)}
    assert len(runs) == 2 and all(not r.startswith("config-") for r in runs), runs


def test_the_name_or_path_and_a_cache_snapshot_name_the_model(tmp_path):
    p = _placed(tmp_path, "qwen3-8b.config.json", "x", _name_or_path="Qwen/Qwen3-8B")
    assert load_model(p, WL).model.name == "Qwen3-8B"
    snap = _placed(tmp_path, "llama-3.1-8b.config.json", "hub", "models--meta-llama--Llama-3.1-8B", "snapshots",
                   "0e9e39f249a16976918f6564b8830bc894c89659")
    assert load_model(snap, WL).model.name == "Llama-3.1-8B"


def test_a_config_json_at_the_root_is_named_by_its_architecture(tmp_path):
    shutil.copy(HF / "mistral-7b-v0.3.config.json", tmp_path / "config.json")
    from tptune.model.spec import parse_model
    raw = json.loads((tmp_path / "config.json").read_text())
    assert parse_model(raw, "/config.json", WL).model.name == "MistralForCausalLM"


def test_the_cpu_defaults_work_is_the_tiny_models():
    """model.plan.CPU_DEFAULT_GFLOP, which a CPU run's size warning and estimate scale by, is the tiny model's at
    every TP."""
    from tptune.model.plan import CPU_DEFAULT_GFLOP, iteration_gflop
    tiny = load_model(ROOT / "config" / "models" / "tiny.yaml", {"seq_length": 512, "micro_batch_size": 1, "dtype": "fp32"})
    assert all(abs(iteration_gflop(tiny, tp) - CPU_DEFAULT_GFLOP) < 1e-9 for tp in (1, 2, 4))
