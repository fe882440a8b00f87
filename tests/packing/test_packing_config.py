"""workload.packing in a run config: the schema's keys and tptune validate's checks, each naming its field
(tptune.packing.spec, settings.resolve)."""
import pytest
from conftest import ROOT, base_config

from tptune.errors import ConfigError
from tptune.packing.spec import PackingSpec, config_problems
from tptune.settings.resolve import Host, load_config_files, resolve

EXAMPLE = {"lengths": "config/packing/rl-bimodal.txt", "rule": "verl", "max_token_len": 1536, "seqs_per_step": 16,
           "forward_passes": 2}


def run_config(tmp_path, packing, **over):
    cfg = base_config(tmp_path, workload={"packing": packing}, tp_sizes=[2], **over)
    cfg.get("confirm", {}).pop("megatron_lm", None)      # not this test's: a key whose schema form is another's
    return cfg


def test_the_example_validates_and_its_spec_loads(tmp_path):
    cfg = load_config_files(ROOT / "config" / "config.yaml", ROOT / "config" / "packing-example.yaml")
    cfg.get("confirm", {}).pop("megatron_lm", None)
    s = resolve(cfg, Host(), base_dir=ROOT)
    spec = PackingSpec.from_config(s.config)
    assert spec.rule == "verl" and spec.forward_passes == 2
    lengths = spec.load(ROOT)
    assert lengths.size == 20000 and lengths.max() == 1536
    assert spec.capacities_for(lengths, tp=2, fp8=False) == [1536, 3072]
    assert s.model.workload.seq_length == 512                   # the model's own workload is untouched
    native, fill = spec.native_steps(lengths, tp=2), spec.fill_steps(lengths, 3072)
    assert len(native) == len(fill) == 1250                      # 20000 / 16, the same steps
    assert [s.real for s in native] == [s.real for s in fill]
    assert native[0].rule == "verl" and {mb.padded for mb in fill[0].micro_batches} == {3072}


@pytest.mark.parametrize("packing,what", [
    ({**EXAMPLE, "rule": "ffd"}, "field 'workload.packing.rule': 'ffd' is not one of ['fill', 'verl', 'slime']"),
    ({**EXAMPLE, "seqs_per_step": 0}, "field 'workload.packing.seqs_per_step': 0 is less than the minimum of 1"),
    ({k: v for k, v in EXAMPLE.items() if k != "max_token_len"},
     "field 'workload.packing.max_token_len': required but missing"),
    ({**EXAMPLE, "capacity": [2048]}, "field 'workload.packing.capacity': unknown key"),
    ({**EXAMPLE, "lengths": "config/packing/missing.txt"}, "file"),
    ({**EXAMPLE, "capacities": [2047]}, "field 'workload.packing.capacities.0' = 2047: expected a multiple of TP 2"),
    ({**EXAMPLE, "max_token_len": 1024}, "veRL asserts max_token_len >= the longest sequence (1536 tokens)"),
    ({**EXAMPLE, "rule": "slime", "max_token_len": 512}, "longer than every candidate capacity"),
    ({**EXAMPLE, "rule": "fill", "max_token_len": 1024}, "rule fill packs into bins of max_token_len"),
])
def test_bad_packing_is_refused_naming_the_field(tmp_path, packing, what):
    with pytest.raises(ConfigError) as e:
        resolve(run_config(tmp_path, packing), Host(), base_dir=ROOT)
    assert what in str(e.value)


def test_config_problems_per_tp(tmp_path):
    (tmp_path / "l.txt").write_text("100\n3000\n")
    p = {"lengths": "l.txt", "rule": "fill", "max_token_len": 4096, "seqs_per_step": 8, "capacities": [4096, 6144]}
    assert config_problems(p, tmp_path, [2, 4]) == []
    assert config_problems(p, tmp_path, [2, 4], fp8=True) == []          # multiples of 32 and 64
    p["capacities"] = [4096, 4608]
    assert config_problems(p, tmp_path, [8], fp8=True, recipe="mxfp8") == [
        "field 'workload.packing.capacities.1' = 4608: expected a multiple of 1024 (FP8 at TP 8: 128 x TP, MXFP8 "
        "userbuffers take a shard's rows in multiples of 128); nearest: 4096"]
    missing = config_problems({"lengths": "l.txt"}, tmp_path, [2])
    assert missing[0] == "field 'workload.packing.rule': required but missing"
