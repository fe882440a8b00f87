"""tptune check (issue 33): a ub_cfgs file and Megatron's switches, judged as Megatron-core 0.19.2 and TE 2.20.2
run them (tptune.te.check; the rules and their sources are in its module doc)."""
import ast
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tptune.errors import ConfigError
from tptune.model.ops import COLUMN_OPS, OPS, ROW_OPS
from tptune.te.check import (check_pair, load_ub_cfgs, megatron_config_fields, op_modes, read_flags,
                             switches_from_flags, switches_from_overrides)
from tptune.emit.megatron_switches import write_megatron_flags, write_overlap_yaml, write_transformer_config_yaml
from tptune.te.megatron_flags import MEGATRON_FIELDS, op_mode, overlap_cfgs, switches_for
from tptune.te.ubcfg import load_preset, merge_entry, op_entries

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "config" / "presets"
REF = Path("/work/ref")          # TE 2.20.2 and megatron-core 0.19.2, unpacked (skipped where absent)
NVIDIA_TP2 = PRESETS / "nvidia_bf16_tp2.yaml"
RS_DGRAD = {**MEGATRON_FIELDS, "tp_comm_overlap": True, "tp_comm_overlap_rs_dgrad": True,
            "tp_comm_bulk_dgrad": False, "tp_comm_bulk_wgrad": False}


def tptune(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-m", "tptune", "check", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def problems(res):
    return {(p.gemm, p.te_does) for p in res.problems}


# --- the CLI on real files ---------------------------------------------------------------------------
@pytest.mark.parametrize("preset, fp8", [("nemo_tp4", False), ("nvidia_bf16_tp2", False),
                                         ("nvidia_fp8_tp2", True), ("nvidia_fp8_tp4", True)])
def test_nvidia_presets_pass_under_megatrons_defaults(preset, fp8):
    r = tptune(PRESETS / f"{preset}.yaml", *(["--fp8"] if fp8 else []))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok: ") and "--sequence-parallel --tp-comm-overlap" in r.stdout


def test_issue33_pair_nvidia_tp2_under_rs_dgrad_with_bulk_off_corrupts(tmp_path):
    """Issue 33: NVIDIA's TP2 preset (bulk qkv/fc1 dgrad and wgrad) loaded beside tp_comm_overlap_rs_dgrad: true
    and bulk off measured 141% input-gradient error on 2x H100. Both switch files name both GEMMs."""
    over = write_transformer_config_yaml(tmp_path / "transformer_config_overrides.yaml", RS_DGRAD)
    flags = write_megatron_flags(tmp_path / "megatron_flags.txt", RS_DGRAD, "tp_comm_overlap_cfg.yaml")
    for opt, path in (("--overrides", over), ("--flags", flags)):
        r = tptune(NVIDIA_TP2, opt, path)
        assert r.returncode == 1, r.stdout + r.stderr
        for g in ("qkv_dgrad", "fc1_dgrad"):
            assert f"{g} [tp_comm_overlap_rs_dgrad: true, tp_comm_bulk_dgrad: false]: bulk_as_reduce_scatter" in r.stdout
        assert "silent gradient corruption" in r.stdout
        # the wgrad entries are not read at all under rs_dgrad
        assert "qkv_wgrad [tp_comm_overlap_rs_dgrad: true, tp_comm_bulk_wgrad: false]: ignored" in r.stdout


def test_issue33_per_tp_file_beside_another_tps_switches(tmp_path):
    """Issue 33's held-out TP4 file: qkv bulk dgrad/wgrad, fc1 a ring-exchange reduce-scatter dgrad. Under the
    run's rs_dgrad switches qkv's bulk communicator runs as a reduce-scatter (36% input-gradient error measured);
    under Megatron's defaults fc1's bulk all-gather hits the reduce-scatter buffer (TE asserted)."""
    cfgs = {k: v for k, v in load_preset("nvidia_bf16_tp2").items() if k != "fc1_wgrad"}
    cfgs["fc1_dgrad"] = {"method": "ring_exchange", "num_sm": 1, "cga_size": 1, "set_sm_margin": 0}
    path = write_overlap_yaml(tmp_path / "tp_comm_overlap_cfg.tp4.yaml", cfgs)
    assert problems(check_pair(load_ub_cfgs(path), RS_DGRAD)) == {("qkv_dgrad", "bulk_as_reduce_scatter"),
                                                                  ("qkv_wgrad", "ignored")}
    r = tptune(path)
    assert r.returncode == 1
    assert "fc1_dgrad [tp_comm_overlap_rs_dgrad: false, tp_comm_bulk_dgrad: true]: assert" in r.stdout
    assert "Invalid shape for a Userbuffers buffer" in r.stdout and "qkv_dgrad" not in r.stdout.split("note:")[0]


def test_ring_exchange_dgrad_under_megatrons_defaults_asserts():
    r = tptune(ROOT / "results" / "rs-dgrad-x2" / "cfgs" / "tuned_rs_ring.yaml")
    assert r.returncode == 1
    assert r.stdout.count(": assert: ") == 2 and "Invalid shape for a Userbuffers buffer" in r.stdout
    # the same file with the switches it was measured under passes
    ok = tptune(ROOT / "results" / "rs-dgrad-x2" / "cfgs" / "tuned_rs_ring.yaml", "--overrides",
                ROOT / "results" / "rs-dgrad-x2" / "cfgs" / "knobs_rs_tuned.overrides.yaml")
    assert ok.returncode == 0, ok.stdout
    fp8 = check_pair(load_ub_cfgs(ROOT / "results" / "rs-dgrad-x2" / "cfgs" / "tuned_rs_ring.yaml"), fp8=True)
    assert "not initialized with FP8 buffers" in fp8.problems[0].detail


def test_overlap_off_ignores_the_whole_file(tmp_path):
    off = write_transformer_config_yaml(tmp_path / "o.yaml", dict(MEGATRON_FIELDS))
    flags = tmp_path / "flags.txt"
    flags.write_text("--sequence-parallel --tensor-model-parallel-size 2 --tp-comm-overlap-cfg nvidia_bf16_tp2.yaml\n")
    for opt, path in (("--overrides", off), ("--flags", flags)):
        r = tptune(NVIDIA_TP2, opt, path)
        assert r.returncode == 1 and "* [tp_comm_overlap: false]: ignored" in r.stdout and "whole file" in r.stdout
    seq_off = check_pair(load_preset("nvidia_bf16_tp2"), {"tp_comm_overlap": True, "sequence_parallel": False})
    assert problems(seq_off) == {("*", "ignored")} and "sequence_parallel" in seq_off.problems[0].switches
    assert check_pair({}, dict(MEGATRON_FIELDS)).ok          # nothing to ignore


def test_every_committed_yaml_has_its_own_switches_beside_it_and_passes():
    """Each tp_comm_overlap_cfg<sfx>.yaml under results/ (run presets aside) sits beside
    transformer_config_overrides<sfx>.yaml and megatron_flags<sfx>.txt of the same set, and passes with
    either: a yaml of one TP never stands beside only another TP's switches (issue 33)."""
    cfgs = [f for f in sorted((ROOT / "results").rglob("tp_comm_overlap_cfg*.yaml")) if "presets" not in f.parts]
    assert len(cfgs) >= 40
    for cfg in cfgs:
        sfx = cfg.name[len("tp_comm_overlap_cfg"):-len(".yaml")]
        over, flags = cfg.parent / f"transformer_config_overrides{sfx}.yaml", cfg.parent / f"megatron_flags{sfx}.txt"
        fp8 = "fp8" in str(cfg.relative_to(ROOT))
        for sw in (switches_from_overrides(over), switches_from_flags(flags)):
            res = check_pair(load_ub_cfgs(cfg), sw, fp8=fp8)
            assert res.ok, (cfg, [p.line() for p in res.problems])
        _, named = read_flags(flags)
        assert named == cfg.name, (flags, named)   # the flags name this set's yaml


def test_json_input_and_output(tmp_path):
    from tptune.emit.configs import write_ub_cfgs_json

    path = write_ub_cfgs_json(tmp_path / "ub_cfgs.json", load_preset("nemo_tp4"))
    r = tptune(path, "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["ok"] and out["runs"]["qkv_dgrad"] == "bulk all-gather"
    r = tptune(path, "--json", "--overrides", write_transformer_config_yaml(tmp_path / "o.yaml", RS_DGRAD))
    out = json.loads(r.stdout)
    assert r.returncode == 1 and {p["te_does"] for p in out["problems"]} == {"bulk_as_reduce_scatter", "ignored"}


# --- the rules, case by case -------------------------------------------------------------------------
def test_omitted_dgrad_takes_tes_bulk_default_under_rs_dgrad():
    cfgs = {"qkv_dgrad": {"method": "ring_exchange"}, "fc1_fprop": {"method": "ring_exchange"}}
    res = check_pair(cfgs, RS_DGRAD)
    assert problems(res) == {("fc1_dgrad", "te_default_conflict")}
    assert "get_default_config: bulk" in res.problems[0].detail and "silent gradient corruption" in res.problems[0].detail
    assert any(n.startswith("proj_fprop: not in the file; TE uses its default (method pipeline") for n in res.notes)
    assert check_pair({**cfgs, "fc1_dgrad": {"method": "ring_exchange"}}, RS_DGRAD).ok


def test_wgrad_beside_a_reduce_scatter_dgrad_asserts_whatever_the_switches():
    cfgs = {"qkv_dgrad": {"method": "ring_exchange"}, "qkv_wgrad": {"method": "bulk"}}
    for sw in (None, RS_DGRAD):
        res = check_pair(cfgs, sw)
        assert ("qkv_wgrad", "assert") in problems(res)
        assert "Cannot specify user UB config for 'qkv_wgrad'" in next(p.detail for p in res.problems if p.gemm == "qkv_wgrad")


def test_pipelined_dgrad_corrupts_under_rs_dgrad_and_runs_as_bulk_without():
    pipe = load_ub_cfgs(ROOT / "results" / "rs-dgrad-x2" / "cfgs" / "tuned_rs_pipe.yaml")
    assert problems(check_pair(pipe, RS_DGRAD)) == {("qkv_dgrad", "pipeline_dgrad"), ("fc1_dgrad", "pipeline_dgrad")}
    assert problems(check_pair(pipe)) == {("qkv_dgrad", "reduce_scatter_as_bulk"), ("fc1_dgrad", "reduce_scatter_as_bulk")}
    assert problems(check_pair(pipe, fp8=True)) == {("qkv_dgrad", "assert"), ("fc1_dgrad", "assert")}
    fp8_buf = {**pipe, "qkv_dgrad": {**pipe["qkv_dgrad"], "fp8_buf": 1}}
    assert ("qkv_dgrad", "reduce_scatter_as_bulk") in problems(check_pair(fp8_buf, fp8=True))


def test_bulk_switch_mismatches():
    ub = load_preset("nvidia_bf16_tp2")
    no_wgrad = {**MEGATRON_FIELDS, "tp_comm_overlap": True, "tp_comm_bulk_wgrad": False}
    assert problems(check_pair(ub, no_wgrad)) == {("qkv_wgrad", "ignored"), ("fc1_wgrad", "ignored")}
    no_dgrad = {**MEGATRON_FIELDS, "tp_comm_overlap": True, "tp_comm_bulk_dgrad": False}
    res = check_pair(ub, no_dgrad)
    assert problems(res) == {("qkv_dgrad", "ignored"), ("fc1_dgrad", "ignored")}
    assert res.runs["qkv_wgrad"] == "bulk reduce-scatter" and op_modes(res.runs)["qkv"] == "partial"
    # the same files without the entries the switches never read are what runs
    assert check_pair({k: v for k, v in ub.items() if not k.endswith("_dgrad") or k[:3] in ("pro", "fc2")}, no_dgrad).ok


def test_rs_dgrad_wins_over_the_bulk_switches(tmp_path):
    """A user who adds only --tp-comm-overlap-rs-dgrad keeps tp_comm_bulk_dgrad/wgrad at their default (on); TE's
    layer turns both off (layernorm_linear.py 'and not self.ub_overlap_rs_dgrad'): a ring-exchange file runs."""
    flags = tmp_path / "flags.txt"
    flags.write_text("--sequence-parallel --tp-comm-overlap --tp-comm-overlap-rs-dgrad\n")
    sw = switches_from_flags(flags)
    ring = load_ub_cfgs(ROOT / "results" / "rs-dgrad-x2" / "cfgs" / "tuned_rs_ring.yaml")
    res = check_pair(ring, sw)
    assert res.ok and res.runs["qkv_wgrad"] == "nccl" and op_modes(res.runs) == dict(
        qkv="rs_dgrad", proj="ub", fc1="rs_dgrad", fc2="ub")
    both = {**ring, "qkv_wgrad": BASE["qkv_wgrad"]}
    both["qkv_dgrad"] = BASE["qkv_dgrad"]
    res = check_pair(both, sw)
    assert problems(res) == {("qkv_dgrad", "bulk_as_reduce_scatter"), ("qkv_wgrad", "ignored")}
    assert "TE turns ub_bulk_wgrad off" in next(p.detail for p in res.problems if p.gemm == "qkv_wgrad")


def test_disable_qkv_turns_off_only_all_gather_and_rs_dgrad():
    """MCORE TELayerNormColumnParallelLinear: disable_qkv sets ub_overlap_ag and ub_overlap_rs_dgrad False for qkv,
    never ub_bulk_dgrad/wgrad: a bulk file keeps qkv's bulk overlap, a ring-exchange dgrad meets a bulk all-gather."""
    ub = load_preset("nvidia_bf16_tp2")
    sw = {**MEGATRON_FIELDS, "tp_comm_overlap": True, "tp_comm_overlap_disable_qkv": True}
    res = check_pair(ub, sw)
    assert problems(res) == {("qkv_fprop", "ignored")}
    assert "tp_comm_overlap_disable_qkv turns qkv's all-gather overlap off" in res.problems[0].detail
    assert res.runs["qkv_dgrad"] == "bulk all-gather" and res.runs["qkv_wgrad"] == "bulk reduce-scatter"
    ring = {k: v for k, v in ub.items() if k not in ("qkv_wgrad", "fc1_wgrad")}
    ring.update(qkv_dgrad={"method": "ring_exchange"}, fc1_dgrad={"method": "ring_exchange"})
    res = check_pair(ring, {**RS_DGRAD, "tp_comm_bulk_dgrad": True, "tp_comm_overlap_disable_qkv": True})
    assert ("qkv_dgrad", "assert") in problems(res) and res.runs["fc1_dgrad"] == "ring_exchange reduce-scatter"
    assert problems(check_pair({k: v for k, v in ring.items() if not k.startswith("qkv")},
                               {**RS_DGRAD, "tp_comm_overlap_disable_qkv": True})) == set()


def test_row_switches_and_invalid_entries():
    ub = load_preset("nvidia_bf16_tp2")
    res = check_pair(ub, {**MEGATRON_FIELDS, "tp_comm_overlap": True, "tp_comm_overlap_rs": False})
    assert problems(res) == {("proj_fprop", "ignored"), ("fc2_fprop", "ignored")}
    res = check_pair(ub, {**MEGATRON_FIELDS, "tp_comm_overlap": True, "tp_comm_overlap_ag": False})
    assert problems(res) == {(g, "ignored") for g in ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")}
    bad = {**ub, "qkv_fprp": {"method": "ring_exchange"}, "fc2_fprop": {"method": "bulk"},
           "proj_fprop": {"method": "pipeline", "colour": 1}, "fc1_fprop": {"method": "ring_exchange", "atomic_gemm": 1}}
    res = check_pair(bad)
    assert problems(res) == {("qkv_fprp", "invalid"), ("fc2_fprop", "invalid"), ("proj_fprop", "invalid"),
                             ("fc1_fprop", "invalid")}
    assert "unknown GEMM" in next(p.detail for p in res.problems if p.gemm == "qkv_fprp")
    assert "Atomic GEMM overlap supported only for FP8 GEMM" in next(p.detail for p in res.problems if p.gemm == "fc1_fprop")


# --- loaders -----------------------------------------------------------------------------------------
def test_flags_files_written_and_hand_made(tmp_path):
    sw = {**RS_DGRAD, "tp_comm_overlap_disable_qkv": True}
    path = write_megatron_flags(tmp_path / "megatron_flags.txt", sw, "tp_comm_overlap_cfg.tp2.yaml")
    got, cfg = read_flags(path)
    # disable_qkv has no flag: the file names it in a comment only, so it stays at Megatron's default
    assert {**MEGATRON_FIELDS, **got} == {**sw, "tp_comm_overlap_disable_qkv": False, "sequence_parallel": True}
    assert cfg == "tp_comm_overlap_cfg.tp2.yaml"
    user = tmp_path / "launch.sh"
    user.write_text("torchrun pretrain_gpt.py --tensor-model-parallel-size 2 \\\n  --sequence-parallel --tp-comm-overlap "
                    "--tp-comm-overlap-cfg=ub.yaml   # overlap\n--disable-tp-comm-bulk-wgrad --no-tp-comm-split-ag "
                    "--tp-comm-bootstrap-backend nccl --lr 1e-4\n")
    assert switches_from_flags(user) == {"sequence_parallel": True, "tp_comm_overlap": True, "tp_comm_bulk_wgrad": False}
    for bad, msg in (("--tp-comm-bulk-dgrad", "--tp-comm-bulk-dgrad: not a Megatron-LM flag"),
                     ("--tp-comm-overlap-disable-qkv", "tp_comm_overlap_disable_qkv has no command-line flag"),
                     ("--tp-comm-overlap-cfg", "--tp-comm-overlap-cfg: no value")):
        user.write_text(f"--tp-comm-overlap {bad}\n")
        with pytest.raises(ConfigError, match=msg) as e:
            read_flags(user)
        assert str(user) in str(e.value)
    r = tptune(NVIDIA_TP2, "--flags", user)
    assert r.returncode == 2 and "--tp-comm-overlap-cfg: no value" in r.stderr
    user.write_text("--tp-comm-overlap --tp-comm-overlap-cfg /data/ub_tp4.yaml\n")
    r = tptune(NVIDIA_TP2, "--flags", user)
    assert r.returncode == 0, r.stdout
    assert "has --tp-comm-overlap but not --sequence-parallel: Megatron-LM asserts it" in r.stdout
    assert "names --tp-comm-overlap-cfg /data/ub_tp4.yaml: Megatron-LM loads that file" in r.stdout


def test_overrides_with_unknown_fields_are_named(tmp_path):
    p = tmp_path / "o.yaml"
    p.write_text("tp_comm_overlap: true\ntp_comm_overlap_rs_dgard: true\nnum_layers: 80\nsequence_paralel: true\n")
    with pytest.raises(ConfigError, match="sequence_paralel, tp_comm_overlap_rs_dgard: not TransformerConfig field"):
        switches_from_overrides(p)
    p.write_text("tp_comm_overlap: yes please\nnum_layers: 80\n")
    with pytest.raises(ConfigError, match="tp_comm_overlap: expected true/false"):
        switches_from_overrides(p)
    p.write_text("tp_comm_overlap: true\nnum_layers: 80\ntp_comm_bootstrap_backend: nccl\n")
    assert switches_from_overrides(p) == {"tp_comm_overlap": True}
    p.write_text("tp_comm_overlap: true\nfoo: 1\n")
    r = tptune(NVIDIA_TP2, "--overrides", p)
    assert r.returncode == 2 and "foo: not TransformerConfig field" in r.stderr and str(p) in r.stderr


def test_unreadable_ub_cfgs_are_named(tmp_path):
    for text, name, msg in (("- a\n- b\n", "a.yaml", "expected a mapping of TE GEMM name"),
                            ("{bad json", "ub.json", "not JSON"), ("a: [\n", "b.yaml", "not YAML")):
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=msg):
            load_ub_cfgs(tmp_path / name)
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    assert load_ub_cfgs(tmp_path / "empty.yaml") == {} and check_pair({}).ok   # TE's defaults
    r = tptune(tmp_path / "missing.yaml")
    assert r.returncode == 2 and "no such file" in r.stderr


# --- property: the per-op decisions megatron_flags.switches_for accepts, and the ones it refuses ---------
BASE = load_preset("nvidia_bf16_tp2")
CHOICES = {op: ("none", "pipeline", "ring_exchange") if op in ROW_OPS else ("none", "bulk", "ring_exchange", "pipeline")
           for op in OPS}


def _setting(op, choice):
    """A per-op decision value as the search records it: the op's own ub_cfgs entries (or "none")."""
    if choice == "none":
        return "none"
    own = op_entries(BASE, op)
    if op in ROW_OPS:
        own[f"{op}_fprop"] = merge_entry(own[f"{op}_fprop"], {"method": choice})
    elif choice != "bulk":             # a reduce-scatter dgrad: TE refuses a wgrad entry beside it
        own = {f"{op}_fprop": own[f"{op}_fprop"], f"{op}_dgrad": merge_entry(own[f"{op}_dgrad"], {"method": choice})}
    return own


DECISIONS = [dict(zip(OPS, c)) for c in itertools.product(*(CHOICES[op] for op in OPS))]


def _decide(choices):
    dec = {op: _setting(op, c) for op, c in choices.items()}
    try:
        return dec, switches_for(dec)
    except ValueError:
        return dec, None


def _without_none_ops(cfgs, choices):
    return {k: v for k, v in cfgs.items() if choices[k.split("_")[0]] != "none"}


def test_every_decision_switches_for_accepts_runs_as_decided():
    """overlap_cfgs(decision) with switches_for(decision) runs as decided, with one exception the check names:
    overlap_cfgs keeps TE's (base) entries for an op left at "none", which the switches never read
    ("ignored"; dropping them leaves the pair that runs). A *pipelined* reduce-scatter dgrad, which TE runs
    wrongly (pipeline_dgrad), switches_for refuses."""
    accepted = 0
    for choices in DECISIONS:
        dec, sw = _decide(choices)
        if sw is None:
            continue
        accepted += 1
        cfgs = overlap_cfgs(dec, BASE)
        assert not any(choices[op] == "pipeline" for op in COLUMN_OPS), choices
        pipe = set()
        if all(c == "none" for c in choices.values()):
            assert problems(check_pair(cfgs, sw)) == {("*", "ignored")}
        else:
            ignored = {(g, "ignored") for g in cfgs if choices[g.split("_")[0]] == "none"}
            assert problems(check_pair(cfgs, sw)) == ignored | pipe, choices
        res = check_pair(_without_none_ops(cfgs, choices), sw)
        assert problems(res) == pipe, choices
        want = {op: op_mode(op, dec[op]) for op in OPS}
        assert op_modes(res.runs) == want, choices
    # all "none", or both rows overlapped (2 x 2 methods) with qkv/fc1 both bulk, both a ring-exchange
    # reduce-scatter, one ring-exchange reduce-scatter beside "none" (2), or both "none": 1 + 4 x (1 + 1 + 2 + 1)
    assert accepted == 21


def test_no_switch_set_runs_a_decision_switches_for_refuses():
    """For every refused decision and each of the 128 switch sets with overlap on, the file (as overlap_cfgs writes
    it, or without the "none" ops' entries) either fails the check or runs something else than decided: the
    refusals are not too strict. "none" cannot be written in a ub_cfgs (an omitted entry takes TE's default), so
    "realises the decision" is judged on what runs (op_modes), not on the file alone."""
    names = [n for n in MEGATRON_FIELDS if n != "tp_comm_overlap"]
    sets = [dict(zip(names, bits), tp_comm_overlap=True) for bits in itertools.product((False, True), repeat=len(names))]
    refused = 0
    for choices in DECISIONS:
        dec, sw = _decide(choices)
        if sw is not None:
            continue
        refused += 1
        want = {op: op_mode(op, dec[op]) for op in OPS}
        full = overlap_cfgs(dec, BASE)
        for cfgs in (full, _without_none_ops(full, choices)):
            for s in sets:
                res = check_pair(cfgs, s)
                assert not (res.ok and op_modes(res.runs) == want), (choices, s)
    assert refused == len(DECISIONS) - 21 == 123


def test_the_check_is_not_vacuous():
    """Some switch set runs each accepted decision (the search over switches above could succeed), and a refused
    decision's closest pair is refused for a reason the check names."""
    ok_sets = [s for s in (dict(MEGATRON_FIELDS, tp_comm_overlap=True), RS_DGRAD) if check_pair(BASE, s).ok]
    assert ok_sets == [dict(MEGATRON_FIELDS, tp_comm_overlap=True)]
    dec, sw = _decide({"qkv": "bulk", "proj": "pipeline", "fc1": "ring_exchange", "fc2": "pipeline"})
    assert sw is None
    cfgs = overlap_cfgs(dec, BASE)
    assert ("fc1_dgrad", "assert") in problems(check_pair(cfgs))
    assert ("qkv_dgrad", "bulk_as_reduce_scatter") in problems(check_pair(cfgs, RS_DGRAD))


# --- the sources the rules mirror ----------------------------------------------------------------------
needs_ref = pytest.mark.skipif(not REF.is_dir(), reason="TE 2.20.2 / megatron-core 0.19.2 sources not unpacked at /work/ref")


@needs_ref
def test_pinned_megatron_fields_match_megatron_core_0_19_2():
    core = REF / "megatron" / "core"
    fields, defaults = set(), {}
    for f in ("model_parallel_config.py", "transformer/transformer_config.py"):
        for c in ast.walk(ast.parse((core / f).read_text())):
            if isinstance(c, ast.ClassDef) and c.name in ("ModelParallelConfig", "TransformerConfig"):
                for n in c.body:
                    if isinstance(n, ast.AnnAssign):
                        fields.add(n.target.id)
                        if isinstance(n.value, ast.Constant):
                            defaults[n.target.id] = n.value.value
    assert megatron_config_fields() == fields
    assert {k: defaults[k] for k in MEGATRON_FIELDS} == MEGATRON_FIELDS   # megatron_flags' pin (read at 0.19.0) holds


@needs_ref
@pytest.mark.parametrize("path, snippets", [
    # initialize_ub: a non-bulk qkv/fc1 dgrad becomes a reduce-scatter and refuses its wgrad's config; the wgrad
    # stays among the bulk methods (TE's default communicator); omitted GEMMs take get_default_config
    ("transformer_engine/pytorch/module/base.py", [
        "Cannot specify user UB config for '{wgrad_name}' when its", 'methods["bulk"].remove(name)',
        '"bulk": ["qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"]', "ub_cfg = get_default_config(name)",
        "Attempting to all-gather FP8 tensor, \"\n                \"but Userbuffers is not initialized with FP8 buffers"]),
    # the column layer: rs_dgrad wins over bulk; backward asks the dgrad communicator for a reduce-scatter, else a
    # bulk all-gather (fill_userbuffers_buffer_for_all_gather), and the wgrad one for the bulk reduce-scatter
    ("transformer_engine/pytorch/module/layernorm_linear.py", [
        "and not self.ub_overlap_rs_dgrad", "ub_overlap_rs_dgrad and self.sequence_parallel and self.parallel_mode == \"column\"",
        "ub_type_dgrad = tex.CommOverlapType.RS", "fill_userbuffers_buffer_for_all_gather(\n                        ub_obj_dgrad,",
        'layout="NN"']),
    ("transformer_engine/pytorch/module/linear.py", [
        'self.parallel_mode == "row" and self.sequence_parallel and ub_overlap_rs',
        'self.parallel_mode == "row" and self.sequence_parallel and ub_overlap_ag']),
    # Megatron: bulk switches pass through untouched; disable_qkv/fc1 turn off only ag and rs_dgrad
    ("megatron/core/extensions/transformer_engine.py", [
        'extra_kwargs["ub_bulk_wgrad"] = self.config.tp_comm_bulk_wgrad',
        'if tp_comm_buffer_name == "qkv" and self.config.tp_comm_overlap_disable_qkv:\n'
        '                        extra_kwargs["ub_overlap_ag"] = False\n'
        '                        extra_kwargs["ub_overlap_rs_dgrad"] = False\n']),
    ("megatron/training/initialize.py", ["ub_cfgs = yaml.safe_load(stream)"]),
    ("megatron/training/arguments.py", ["allow_abbrev=False", '"tp_comm_overlap_disable_qkv",',
                                        "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism"]),
])
def test_rules_mirror_the_sources(path, snippets):
    text = (REF / path).read_text()
    for s in snippets:
        assert s in text, (path, s)
