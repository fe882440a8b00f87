"""Megatron-core TP overlap switches from per-op decisions, the flags writer and the config loader check."""
import ast
import importlib.util

import pytest
import yaml

from tptune.emit.megatron_switches import write_megatron_flags, write_overlap_yaml, write_transformer_config_yaml
from tptune.te.megatron_flags import (MEGATRON_FIELDS, check_megatron, megatron_flags, overlap_cfgs, switches_for, transformer_config_overrides)
from tptune.te.ubcfg import load_preset, validate_ub_cfgs

UB = load_preset("nvidia_bf16_tp2")


def rs_dgrad(op):
    return {f"{op}_dgrad": {"method": "ring_exchange"}}


def test_all_overlapped_is_megatrons_default():
    sw = switches_for({op: UB for op in ("qkv", "proj", "fc1", "fc2")})
    assert sw == {**MEGATRON_FIELDS, "tp_comm_overlap": True}
    assert megatron_flags(sw, "tp_comm_overlap_cfg.yaml") == [
        "--sequence-parallel", "--tp-comm-overlap", "--tp-comm-overlap-cfg tp_comm_overlap_cfg.yaml"]


def test_nothing_overlapped_means_no_flags():
    sw = switches_for({op: "none" for op in ("qkv", "proj", "fc1", "fc2")})
    assert sw == MEGATRON_FIELDS and megatron_flags(sw) == []


def test_qkv_plain_nccl_with_fc1_reduce_scatter_dgrad(tmp_path):
    sw = switches_for({"qkv": "none", "proj": UB, "fc1": rs_dgrad("fc1"), "fc2": UB})
    assert sw["tp_comm_overlap_disable_qkv"] and not sw["tp_comm_overlap_disable_fc1"]
    assert sw["tp_comm_overlap_rs_dgrad"] and not sw["tp_comm_bulk_dgrad"] and not sw["tp_comm_bulk_wgrad"]
    flags = megatron_flags(sw)
    assert flags == ["--sequence-parallel", "--tp-comm-overlap", "--no-tp-comm-bulk-wgrad",
                     "--no-tp-comm-bulk-dgrad", "--tp-comm-overlap-rs-dgrad"]
    text = write_megatron_flags(tmp_path / "megatron_flags.txt", sw).read_text()
    assert "--tp-comm-overlap-rs-dgrad" in text and "tp_comm_overlap_disable_qkv: true has no command-line flag" in text
    assert "(transformer_config_overrides.yaml)" in text   # the file decide writes beside it
    tc = yaml.safe_load(write_transformer_config_yaml(tmp_path / "tc.yaml", sw).read_text())
    assert tc["sequence_parallel"] is True and tc["tp_comm_overlap_disable_qkv"] is True
    assert set(tc) == set(MEGATRON_FIELDS) | {"sequence_parallel"}


def test_column_ops_plain_rows_overlapped():
    sw = switches_for({"qkv": "none", "proj": UB, "fc1": "none", "fc2": UB})
    assert sw["tp_comm_overlap_disable_qkv"] and sw["tp_comm_overlap_disable_fc1"]
    assert not sw["tp_comm_bulk_dgrad"] and sw["tp_comm_overlap_ag"] and sw["tp_comm_overlap_rs"]


@pytest.mark.parametrize("decision, match", [
    ({"qkv": UB, "proj": "none", "fc1": UB, "fc2": UB}, "proj cannot keep plain NCCL while fc2"),
    ({"qkv": UB, "proj": "none", "fc1": UB, "fc2": "none"}, "tp_comm_overlap_ag off"),
    ({"qkv": "none", "proj": UB, "fc1": UB, "fc2": UB}, "bulk dgrad/wgrad overlap"),
    ({"qkv": UB, "proj": UB, "fc1": rs_dgrad("fc1"), "fc2": UB}, "one switch for both"),
    ({"qkv": UB, "proj": UB, "fc1": UB}, "each of"),
    ({"qkv": 3, "proj": UB, "fc1": UB, "fc2": UB}, "expected 'none'"),
])
def test_rejections_name_megatrons_reason(decision, match):
    with pytest.raises(ValueError, match=match):
        switches_for(decision)


def test_overlap_cfg_drops_the_wgrad_of_a_reduce_scatter_dgrad(tmp_path):
    dec = {"qkv": rs_dgrad("qkv"), "proj": UB, "fc1": rs_dgrad("fc1"), "fc2": UB}
    cfgs = overlap_cfgs(dec, UB)
    assert "qkv_wgrad" not in cfgs and "fc1_wgrad" not in cfgs and cfgs["qkv_dgrad"]["method"] == "ring_exchange"
    back = yaml.safe_load(write_overlap_yaml(tmp_path / "o.yaml", cfgs).read_text())
    validate_ub_cfgs(back)
    assert back == cfgs


def test_switch_checks():
    with pytest.raises(ValueError, match="missing"):
        megatron_flags({"tp_comm_overlap": True})
    with pytest.raises(ValueError, match="true/false"):
        transformer_config_overrides({**MEGATRON_FIELDS, "tp_comm_overlap": 1})


def test_field_names_match_megatron_core():
    """The real ModelParallelConfig when megatron-core is installed (the GPU machines); here the
    pinned names must be dataclass fields of the pinned source's shape (bool with that default)."""
    sw = switches_for({op: UB for op in ("qkv", "proj", "fc1", "fc2")})
    if importlib.util.find_spec("megatron") is not None:
        cfg = check_megatron(sw)
        assert cfg is not None and cfg.tp_comm_overlap
    else:
        assert check_megatron(sw) is None
        # the pinned list, as read from core_v0.19.0 model_parallel_config.py
        src = ("tp_comm_overlap: bool = False\ntp_comm_bulk_wgrad: bool = True\ntp_comm_bulk_dgrad: bool = True\n"
               "tp_comm_overlap_ag: bool = True\ntp_comm_overlap_rs: bool = True\n"
               "tp_comm_overlap_rs_dgrad: bool = False\ntp_comm_overlap_disable_qkv: bool = False\n"
               "tp_comm_overlap_disable_fc1: bool = False\n")
        pinned = {n.target.id: n.value.value for n in ast.parse(src).body}
        assert pinned == MEGATRON_FIELDS


def test_benches_build_layers_under_the_emitted_switches():
    """The op bench of a reduce-scatter dgrad needs tp_comm_overlap_rs_dgrad; a block gets exactly the
    switches the override file is written from; a block Megatron cannot build is refused by name."""
    from tptune.te.megatron_flags import block_switches, op_switches

    assert op_switches("qkv", UB) == {**MEGATRON_FIELDS, "tp_comm_overlap": True}
    ring = {k: v for k, v in UB.items() if k != "fc1_wgrad"} | {"fc1_dgrad": {"method": "ring_exchange"}}
    assert op_switches("fc1", ring)["tp_comm_overlap_rs_dgrad"] is True
    assert op_switches("proj", ring)["tp_comm_overlap_rs_dgrad"] is False
    both = {k: v for k, v in ring.items() if k != "qkv_wgrad"} | {"qkv_dgrad": {"method": "ring_exchange"}}
    sw = block_switches(both)
    assert sw["tp_comm_overlap_rs_dgrad"] and not sw["tp_comm_bulk_dgrad"] and not sw["tp_comm_bulk_wgrad"]
    assert transformer_config_overrides(sw)["tp_comm_overlap_rs_dgrad"] is True
    with pytest.raises(ValueError, match="tp_comm_overlap_rs_dgrad is one switch for both"):
        block_switches(ring)   # qkv bulk, fc1 reduce-scatter
    with pytest.raises(ValueError, match="qkv_dgrad: a pipelined reduce-scatter dgrad"):
        block_switches(both | {"qkv_dgrad": {"method": "pipeline"}})   # TE corrupts it (te.check)
