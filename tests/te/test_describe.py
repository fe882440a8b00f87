"""Settings in words (issue 47, "the house"): the settings committed runs chose, NVIDIA's presets, no overlap and
the torch backend's chunks read as a person would say them, not as case ids."""
import json
from pathlib import Path

import pytest

from tptune.te.describe import describe_setting
from tptune.te.ubcfg import load_preset

RESULTS = Path(__file__).parents[2] / "results"
TP24 = RESULTS / "tp24-llama3-70b-h200x4" / "rep1"


def _configs(run: Path) -> dict[str, dict]:
    return {op: rec["config"] for op, rec in json.loads((run / "decisions.json").read_text())["ops"].items()}


def test_the_tp24_runs_per_op_settings_read_as_ring_exchange_with_the_reduce_scatter_in_dgrad():
    """Each op's chosen setting of results/tp24-llama3-70b-h200x4/rep1 (its case id spells out every knob at TE's
    default: ub.te+fprop.ring.sm1.cga1.margin0.agg0.ce1+dgrad.ring.sm1.cga1.margin0.agg0.ce1)."""
    words = {op: describe_setting(c["variant"], op=op, ub_cfgs=c["ub_cfgs"]) for op, c in _configs(TP24).items()}
    assert words == {"qkv": "ring exchange for every GEMM, reduce-scatter inside dgrad",
                     "proj": "ring exchange for every GEMM",
                     "fc1": "ring exchange for every GEMM, reduce-scatter inside dgrad",
                     "fc2": "ring exchange for every GEMM"}


def test_bulk_gemms_with_equal_knobs_are_grouped_and_only_knobs_off_tes_defaults_are_named():
    qkv = _configs(RESULTS / "qwen2.5-32b-h200x4-tp4")["qkv"]
    assert qkv["variant"] == "ub.te+fprop.ring.sm1.cga1.margin0.agg0.ce1+dgrad.bulk.sm8.cga2.margin0+wgrad.bulk.sm8.cga2.margin0"
    assert describe_setting(qkv["variant"], op="qkv", ub_cfgs=qkv["ub_cfgs"]) == \
        "fprop ring exchange; dgrad and wgrad bulk, 8 SMs each, no SM margin"
    assert describe_setting("ub.te+fprop.ring+dgrad.bulk.sm2+wgrad.bulk.sm8", op="qkv") == \
        "fprop ring exchange; dgrad bulk, 2 SMs; wgrad bulk, 8 SMs"
    assert describe_setting("proj-tp4-ub.te+fprop.ring.cprio0.gprio5") == \
        "fprop ring exchange, comm priority 0, GEMM priority -5; dgrad ring exchange"


@pytest.mark.parametrize("run", ["tp24-llama3-70b-h200x4/rep1", "qwen2.5-32b-h200x4-tp4", "knobs-llama3-70b-h100x4-tp4",
                                 "stability-llama3-70b-x2/rep1", "fp8-llama3-70b-x2"])
def test_a_variant_reads_the_same_from_its_id_as_from_its_recorded_ub_cfgs(run):
    for op, c in _configs(RESULTS / run).items():
        if c.get("ub_cfgs"):
            assert describe_setting(c["variant"], op=op) == describe_setting(c["variant"], op=op, ub_cfgs=c["ub_cfgs"])


def test_presets_are_named_and_references_said_in_words():
    assert describe_setting("ub.nvidia_bf16_tp2") == "NVIDIA's TP 2 preset `nvidia_bf16_tp2`"
    assert describe_setting("qkv-tp2-ub.nemo_tp4") == "NeMo's TP 4 preset `nemo_tp4`"
    assert describe_setting("ub.te", op="fc1") == "TE's defaults"
    assert describe_setting(ub_cfgs=load_preset("te")) == "TE's defaults"
    assert describe_setting("ub.te+fprop.ring", op="qkv") == "TE's defaults"    # qkv's fprop is a ring by default
    assert describe_setting("none", op="qkv") == describe_setting("layer-tp2-none") == "no overlap"
    assert describe_setting("ub.user9", presets_dir=[]) == "preset `user9`"   # no such file: named only


def test_the_torch_backends_chunked_variant_is_its_chunk_count():
    assert describe_setting("chunked.n4", op="fc1") == "4 chunks"
    assert describe_setting("fc2-tp2-chunked.n2") == "2 chunks"


def test_a_whole_file_names_only_the_gemms_off_tes_defaults():
    """A run's own block combinations, from its presets/ (what report.md's "the file holds" line says)."""
    assert describe_setting("layer-tp4-ub.tuned_tp4", presets_dir=[TP24 / "presets"]) == \
        "ring exchange for every GEMM, reduce-scatter inside dgrad"
    stability = RESULTS / "stability-llama3-70b-x2" / "rep1" / "presets"
    assert describe_setting("ub.tuned_tp2", presets_dir=[stability]) == (
        "TE's defaults except proj and fc2 fprop ring exchange; qkv dgrad bulk, 2 SMs; "
        "fc1 dgrad and wgrad bulk, 1 SM each")
