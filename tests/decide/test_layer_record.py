"""layer.layer_record on recorded block sessions: the block-level winner must pass the numerics check."""
import json
import statistics
import types
from pathlib import Path

from tptune.decide.layer import layer_record
from tptune.records.measured_point import MeasuredPoint
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session
from tptune.model.spec import load_model
from tptune.settings.blocks import Decision, Layer, Search

DRIFT = [1.0, 1.01, 0.99, 1.0]
TUNED, NEMO, NONE = "layer-tp2-ub.tuned_tp2", "layer-tp2-ub.nemo_tp4", "layer-tp2-none"
TINY = load_model(Path(__file__).parents[2] / "config" / "models" / "tiny.yaml",
                  {"seq_length": 512, "micro_batch_size": 1, "dtype": "fp32"})
S = types.SimpleNamespace(decision=Decision.from_dict({"noise_floor": 0.02}),
                          layer=Layer.from_dict({"num_layers": 2}), model=TINY)


def _session(run_dir, members, host_behind=()):
    """members: {case id: (block ms, numerics ok)} -> sessions/layer/tp2 as Launcher.session writes it, read back;
    ``host_behind``: the members whose every batch failed the host-ahead check."""
    d = run_dir / "sessions" / "layer" / "tp2"
    runs = {}
    for cid, (ms, ok) in members.items():
        m = d / cid.split("-", 2)[2]
        m.mkdir(parents=True)
        runs[cid] = f"{m.name}/run.json"
        if ms is None:   # a member that failed: no rounds
            (m / "run.json").write_text(json.dumps({"case": cid, "status": "failed", "session": "layer/tp2",
                                                    "error": {"kind": "init", "message": "failed to build"}}))
            continue
        rounds = [ms * x for x in DRIFT]
        (m / "run.json").write_text(json.dumps({
            "case": cid, "status": "ok", "session": "layer/tp2",
            "timing": {"total_ms": {"median": statistics.median(rounds), "rounds": rounds,
                                    "round_ids": list(range(len(rounds)))}},
            "host": {"host_ms": 10.0, "batches": [{"timing": "gpu_host_ahead", "round": r, "host_ahead": False}
                                                  for r in range(len(rounds))] if cid in host_behind else []},
            "correctness": {"ok": ok}}))
    (d / "session.json").write_text(json.dumps({"session": "layer/tp2", "runs": runs, "rounds": 4,
                                                "stop": "resolved after 4 rounds"}))
    return load_session(d)


def test_tuned_that_fails_numerics_gives_way_to_the_fastest_passing_setting(tmp_path):
    rec = layer_record(S, 2, _session(tmp_path, {NONE: (81.0, True), NEMO: (79.5, True), TUNED: (78.0, False)}),
                       TUNED)
    assert rec["winner"] == NEMO and not rec["numerics_failed"]
    assert "failed the numerics check" in rec["reason"]


def test_no_passing_overlap_setting_is_flagged(tmp_path):
    rec = layer_record(S, 2, _session(tmp_path, {NONE: (81.0, True), NEMO: (79.5, False), TUNED: (78.0, False)}),
                       TUNED)
    assert rec["winner"] is None and rec["numerics_failed"] is True


def test_a_failing_reference_cannot_displace_the_tuned_setting(tmp_path):
    rec = layer_record(S, 2, _session(tmp_path, {NONE: (81.0, True), NEMO: (70.0, False), TUNED: (78.0, True)}),
                       TUNED)
    assert rec["winner"] == TUNED
    passing = layer_record(S, 2, _session(tmp_path / "b", {NONE: (81.0, True), NEMO: (70.0, True),
                                                           TUNED: (78.0, True)}), TUNED)
    assert passing["winner"] == NEMO


def _pt(case, ms):
    rounds = [ms * x for x in DRIFT]
    return MeasuredPoint.from_dict({"case": case, "status": "ok", "session": "p", "timing": {
        "total_ms": {"median": statistics.median(rounds), "rounds": rounds, "round_ids": list(range(len(rounds)))}}})


def test_a_block_pick_over_the_tuned_file_needs_gpu_time_not_host_bound_figures(tmp_path):
    """Qwen3-30B-A3B's MoE block on 2x H100: every batch behind the host, so a setting reading faster there is
    host launch time: the file keeps the tuned combination and says why. With the host ahead, the pick stands."""
    members = {NONE: (81.0, True), NEMO: (70.0, True), TUNED: (78.0, True)}
    rec = layer_record(S, 2, _session(tmp_path, members, host_behind={TUNED, NEMO}), TUNED)
    assert rec["winner"] == TUNED
    assert "include host launch time" in rec["reason"] and "4 of 4 batches of ub.nemo_tp4" in rec["reason"]
    assert layer_record(S, 2, _session(tmp_path / "b", members), TUNED)["winner"] == NEMO


def test_a_reference_run_with_its_recipes_environment_is_compared_but_never_written(tmp_path):
    """nemo_tp4_recipe (nemo_tp4 with NVIDIA's layernorm SM margins) beats the tuned block here, but the
    files carry no environment, so the file keeps the tuned combination and the row names the variables."""
    recipe = "layer-tp2-ub.nemo_tp4_recipe"
    rec = layer_record(S, 2, _session(tmp_path, {NONE: (81.0, True), recipe: (70.0, True), TUNED: (78.0, True)}),
                       TUNED)
    row = next(r for r in rec["settings"] if r["case"] == recipe)
    assert rec["winner"] == TUNED and row["tuned_vs"]["outcome"] == 1
    assert row["environment"] == {"NVTE_FWD_LAYERNORM_SM_MARGIN": "20", "NVTE_BWD_LAYERNORM_SM_MARGIN": "20"}
    assert "environment" not in next(r for r in rec["settings"] if r["case"] == TUNED)
    assert "nemo_tp4_recipe beats it beyond the noise with its recipe's environment" in rec["reason"]


def test_block_session_adds_the_fastest_combination_where_ties_went_to_the_cheaper(tmp_path):
    """qkv: NVIDIA's preset 1% faster than a cheaper setting (a tie: the tuned file takes the cheaper);
    the block also measures the combination of each op's fastest setting, and says which it is."""
    import yaml

    from tptune.cli.stages import block_members
    from tptune.te.ubcfg import load_preset

    s = types.SimpleNamespace(backend="te", decision=Decision.from_dict({"noise_floor": 0.02}), layer=Layer.from_dict({}),
                              search=Search.from_dict({"te_presets": ["nvidia_bf16_tp2"]}),
                              model=types.SimpleNamespace(workload=types.SimpleNamespace(is_fp8=False, ub_rules="bf16"),
                                                          model=types.SimpleNamespace(is_moe=False)))
    pts = {}
    for op in ("qkv", "proj", "fc1", "fc2"):
        cheap, preset = f"{op}-tp2-ub.te+dgrad.bulk.sm2", f"{op}-tp2-ub.nvidia_bf16_tp2"
        if op in ("proj", "fc2"):
            cheap = f"{op}-tp2-ub.te+fprop.ring"
        faster = 0.99 if op == "qkv" else 1.05
        pts[op] = {"none": _pt(f"{op}-tp2-none", 12.0), "nocomm": _pt(f"{op}-tp2-nocomm", 9.0),
                   "candidates": {cheap: _pt(cheap, 10.0), preset: _pt(preset, 10.0 * faster)}}
    members, tuned = block_members(s, 2, pts, RunDir(tmp_path))
    ids = [c.id for c in members]
    assert tuned.id == "layer-tp2-ub.tuned_tp2" and "layer-tp2-ub.fastest_tp2" in ids
    assert "layer-tp2-nocomm" in ids   # layer.bound (default on): the block's own bound beside the settings
    fast = yaml.safe_load((tmp_path / "presets" / "fastest_tp2.yaml").read_text())
    tuned_cfg = yaml.safe_load((tmp_path / "presets" / "tuned_tp2.yaml").read_text())
    nv = load_preset("nvidia_bf16_tp2")
    assert all(fast[f"qkv_{g}"] == nv[f"qkv_{g}"] for g in ("fprop", "dgrad", "wgrad"))
    assert tuned_cfg["qkv_dgrad"]["num_sm"] == 2 and fast["proj_fprop"] == tuned_cfg["proj_fprop"]
    # when every op's fastest is its chosen setting, nothing is added
    for op in pts:
        pts[op]["candidates"] = {k: v for k, v in pts[op]["candidates"].items() if "nvidia" not in k}
    members, _ = block_members(s, 2, pts, RunDir(tmp_path / "b"))
    assert "layer-tp2-ub.fastest_tp2" not in [c.id for c in members]
    s.layer = Layer.from_dict({"bound": False})
    members, _ = block_members(s, 2, pts, RunDir(tmp_path / "c"))
    assert "layer-tp2-nocomm" not in [c.id for c in members]
    s.layer, s.model.model.is_moe = Layer.from_dict({}), True    # an MoE block has no bound of its own
    members, _ = block_members(s, 2, pts, RunDir(tmp_path / "d"))
    assert "layer-tp2-nocomm" not in [c.id for c in members]


def test_block_session_unifies_the_dgrad_mode_that_one_megatron_switch_sets(tmp_path):
    """qkv wins with a reduce-scatter dgrad, fc1 with bulk: Megatron cannot build that block. The block
    measures the per-op choices within each mode, tuned = the mode with the lower estimate, and every
    written combination is one that Megatron's switches express."""
    import yaml

    from tptune.cli.stages import block_members
    from tptune.te.megatron_flags import block_switches
    from tptune.te.ubcfg import load_preset

    s = types.SimpleNamespace(backend="te", decision=Decision.from_dict({"noise_floor": 0.02}), layer=Layer.from_dict({}),
                              search=Search.from_dict({"te_presets": []}),
                              model=types.SimpleNamespace(workload=types.SimpleNamespace(is_fp8=False, ub_rules="bf16"),
                                                          model=types.SimpleNamespace(is_moe=False)))
    pts = {}
    for op, rs_ms, bulk_ms in (("qkv", 3.0, 3.3), ("fc1", 17.9, 17.5)):
        rs, bulk = f"{op}-tp2-ub.te+dgrad.ring", f"{op}-tp2-ub.te+dgrad.bulk.sm2"
        pts[op] = {"none": _pt(f"{op}-tp2-none", 20.0), "nocomm": _pt(f"{op}-tp2-nocomm", 2.0),
                   "candidates": {rs: _pt(rs, rs_ms), bulk: _pt(bulk, bulk_ms)}}
    for op in ("proj", "fc2"):
        ring = f"{op}-tp2-ub.te+fprop.ring"
        pts[op] = {"none": _pt(f"{op}-tp2-none", 12.0), "nocomm": _pt(f"{op}-tp2-nocomm", 9.0),
                   "candidates": {ring: _pt(ring, 10.0)}}
    members, tuned = block_members(s, 2, pts, RunDir(tmp_path))
    ids = [c.id for c in members]
    assert tuned.id == "layer-tp2-ub.tuned_tp2" and "layer-tp2-ub.tuned_other_dgrad_tp2" in ids
    d = tmp_path / "presets"
    t, o = load_preset("tuned_tp2", d), load_preset("tuned_other_dgrad_tp2", d)
    # rs: 3.0 + 17.9 = 20.9 ms against bulk: 3.3 + 17.5 = 20.8 ms -> tuned is the bulk combination
    assert t["qkv_dgrad"]["method"] == t["fc1_dgrad"]["method"] == "bulk" and t["qkv_dgrad"]["num_sm"] == 2
    assert o["qkv_dgrad"]["method"] == o["fc1_dgrad"]["method"] == "ring_exchange"
    assert "qkv_wgrad" not in o and "fc1_wgrad" not in o
    assert block_switches(o)["tp_comm_overlap_rs_dgrad"] and not block_switches(t)["tp_comm_overlap_rs_dgrad"]
    assert "one switch" in (d / "tuned_tp2.yaml").read_text()
    assert yaml.safe_load((d / "tuned_tp2.yaml").read_text())["fc1_dgrad"]["num_sm"] == 2


BOUND = "layer-tp2-nocomm"


def test_the_blocks_bound_is_measured_beside_the_settings_but_never_wins_nor_counts_as_a_comparison(tmp_path):
    """layer.bound: the no-communication block is faster than everything and passes only a finite check;
    it is no setting to write, and a bound that failed is not 'a reference not compared'."""
    rec = layer_record(S, 2, _session(tmp_path, {NONE: (81.0, True), BOUND: (76.0, True), NEMO: (79.5, True),
                                                 TUNED: (78.0, True)}), TUNED)
    assert rec["winner"] == TUNED and rec["compared"]
    assert rec["reason"] == "no reference beats the tuned combination on the block beyond the noise"
    failed = layer_record(S, 2, _session(tmp_path / "b", {NONE: (81.0, True), BOUND: (None, None),
                                                          TUNED: (78.0, True)}), TUNED)
    assert failed["winner"] == TUNED and "nocomm" not in failed["reason"]
    alone = layer_record(S, 2, _session(tmp_path / "c", {BOUND: (76.0, True), TUNED: (78.0, True)}), TUNED)
    assert not alone["compared"]
