"""What the H200 runs recorded, checked on CPU: TP=4 traces, the committed results, and the decisions
re-derived from the recorded points with this checkout's decision code."""
import json

import pytest
import yaml

from tptune.model.ops import TE_GEMMS
from tptune.te.ubcfg import validate_ub_cfgs
from tptune.trace import load_trace, summarize, trace_metrics
from tptune.trace.classify import classify
from tptune.records.run_dir import RunDir

from conftest import FIXTURES, ROOT

TP4 = FIXTURES / "gpu" / "tp4"
RESULTS = ROOT / "results" / "legacy"
RUNS = ["h200x4-llama3-70b", "h200x4-llama3-70b-grid", "h200x4-llama3-70b-joint-qkv", "h200x2-llama3-70b"]
STABILITY = ROOT / "results" / "stability-llama3-70b-x2"
REPS = ["rep1", "rep2", "rep3"]
# the harness of this session (gc-frozen workers, queue-fed block batches): two runs, one machine
STABILITY_V2 = ROOT / "results" / "stability-llama3-70b-x2-v2"
REPS_V2 = ["rep1", "rep2", "rep3"]   # rep3: a later session, no layer stage, bound = none with local collectives
KNOBS = ROOT / "results" / "knobs-llama3-70b-x2"
KNOBS_REP2 = ROOT / "results" / "knobs-llama3-70b-x2-rep2"   # the same config again, same lease
RS_DGRAD = ROOT / "results" / "rs-dgrad-x2"
FP8 = ROOT / "results" / "fp8-llama3-70b-x2"
FP8_CURRENT = ROOT / "results" / "fp8-current-llama3-70b-x2"
REDERIVED = [STABILITY / r for r in REPS] + [STABILITY_V2 / r for r in REPS_V2] + [KNOBS, KNOBS_REP2, FP8, FP8_CURRENT]


def _phase(summary, phase, col):
    return summary.filter(summary["phase"] == phase)[f"{col}_max"][0]


@pytest.mark.parametrize("op", ["qkv", "fc1"])
def test_tp4_forward_comm_exposed_with_nccl_hidden_with_userbuffers(op):
    base = summarize(trace_metrics([TP4 / f"{op}-tp4-none.rank0.trace.json.gz"]))
    for v in ("ub.te", "ub.nemo_tp4"):
        ub = summarize(trace_metrics([TP4 / f"{op}-tp4-{v}.rank0.trace.json.gz"]))
        assert _phase(base, "forward", "overlap_ms") == 0.0  # NCCL all-gather, then the GEMM
        assert _phase(base, "forward", "exposed_comm_ms") > 0.3
        assert _phase(ub, "forward", "overlap_ms") > 0.25  # ring-exchange chunks under the GEMM
        assert _phase(ub, "forward", "exposed_comm_ms") < _phase(base, "forward", "exposed_comm_ms")


@pytest.mark.parametrize("name", sorted(p.name for p in TP4.glob("*.trace.json.gz")))
def test_tp4_kernel_classes(name):
    t = load_trace(TP4 / name)
    k = classify(t.gpu)
    comm = set(k.filter(k["cls"] == "comm")["name"].cast(str))
    gemm = set(k.filter(k["cls"] == "gemm")["name"].cast(str))
    assert gemm and all(n.startswith("nvjet_") for n in gemm)
    if "-none." in name:
        assert comm and all(n.startswith("ncclDevKernel_") for n in comm)
    else:
        assert any("userbuffers" in n for n in comm)
        assert not any(n.startswith("ncclDevKernel_") for n in comm)


@pytest.mark.parametrize("run", RUNS)
def test_committed_run_jsons(run):
    runs = [json.loads(p.read_text()) for p in (RESULTS / run / "cases").rglob("run.json")]
    assert len(runs) >= 40
    for r in runs:
        env = r["environment"] if r["status"] == "ok" else None
        if env:
            assert env["gpu_name"] == "NVIDIA H200" and env["sm_count"] == 132
            assert env["env"] == {"UB_SKIPMC": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                  "NVSHMEM_DISABLE_NVLS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
            assert r["timing"]["total_ms"]["n"] == 30
            if r["variant"].startswith("ub."):
                assert r["correctness"]["ok"], r["case"]
    failed = [r for r in runs if r["status"] != "ok"]
    if run.endswith("-grid"):  # the deliberately hanging case, and only it
        assert [(r["case"], r["error"]["kind"]) for r in failed] == [("qkv-tp2-ub.te+dgrad.bulk.sm1", "timeout")]
    else:
        assert not failed


@pytest.mark.parametrize("run", RUNS)
def test_emitted_configs_load_as_they_are(run):
    for f in (RESULTS / run).glob("tp_comm_overlap_cfg*.yaml"):
        cfg = yaml.safe_load(f.read_text())
        assert sorted(cfg) == sorted(TE_GEMMS)
        validate_ub_cfgs(cfg)
    assert json.loads((RESULTS / run / "ub_cfgs.json").read_text()) == yaml.safe_load(
        (RESULTS / run / "tp_comm_overlap_cfg.yaml").read_text())


def test_legacy_runs_are_refused_by_rederive(tmp_path):
    import shutil

    import subprocess
    import sys

    shutil.copytree(RESULTS / "h200x2-llama3-70b", tmp_path / "run")
    p = subprocess.run([sys.executable, "-m", "tptune", "rederive", str(tmp_path / "run")],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "recorded before side-by-side sessions" in p.stderr


def _settings(run_dir):
    from tptune.measure.preflight import resolve_here

    cfg = json.loads((run_dir / "config.json").read_text())
    cfg.pop("_source", None), cfg.pop("_base_dir", None)
    return resolve_here(cfg, base_dir=ROOT, check_hardware=False)


@pytest.mark.parametrize("src", REDERIVED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_gpu_run_rederives_to_its_committed_decisions(src, tmp_path):
    """Every search step, TP point, block record and decision replayed from the recorded sessions gives
    the committed decisions.json (the measurements never change; only this checkout's code decides)."""
    import shutil

    from tptune.cli.rederive import rederive

    run = tmp_path / src.name
    shutil.copytree(src, run)
    rederive(_settings(run), RunDir(run))
    got = json.loads((run / "decisions.json").read_text())
    want = json.loads((src / "decisions.json").read_text())
    assert got["meta"]["model_tp"] == want["meta"]["model_tp"] == 2
    assert got["meta"]["model_tp_rule"] == want["meta"]["model_tp_rule"]
    for op in ("qkv", "proj", "fc1", "fc2"):
        assert got["ops"][op]["tp"] == want["ops"][op]["tp"] == 2
        assert got["ops"][op]["config"]["variant"] == want["ops"][op]["config"]["variant"], op
    assert (got["meta"].get("layer") or {}).get("2", {}).get("winner") == \
        (want["meta"].get("layer") or {}).get("2", {}).get("winner")


@pytest.mark.parametrize("run", [STABILITY / r for r in REPS] + [STABILITY_V2 / r for r in REPS_V2] + [KNOBS, KNOBS_REP2],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_bf16_runs_bound_below_every_setting_and_host_ahead(run):
    for sj in (run / "sessions").glob("*/tp2/point/session.json"):
        sess = json.loads(sj.read_text())
        runs = {c: json.loads((sj.parent / p).read_text()) for c, p in sess["runs"].items()}
        bound = next(r for c, r in runs.items() if c.endswith("-nocomm"))
        for c, r in runs.items():
            assert r["status"] == "ok", c
            assert r["host"]["host_ahead"] is True, c
            assert r["environment"]["env"]["UB_SKIPMC"] == "1"
            # strictly below in the stability runs. The knob runs' fc2 with copy-engine ring exchanges
            # (no SMs move data) reaches the bound, whose stand-in local copies take SMs: its median is
            # 3% below the bound's, a tie by the paired rounds, so decide flags no fault (asserted below)
            if r is not bound and run not in (KNOBS, KNOBS_REP2):
                assert bound["timing"]["total_ms"]["median"] < r["timing"]["total_ms"]["median"], c
            if r["variant"].startswith("ub."):
                assert r["correctness"]["ok"], c
    dec = json.loads((run / "decisions.json").read_text())
    assert dec["meta"]["measurement"]["bound_faults"] == []


@pytest.mark.parametrize("root,reps", [(STABILITY, REPS), (STABILITY_V2, ["rep1", "rep2"])], ids=["v1", "v2"])
def test_stability_runs_agree_or_call_the_difference_a_tie(root, reps):
    decs = {rep: json.loads((root / rep / "decisions.json").read_text()) for rep in reps}
    assert len({d["meta"]["model_tp"] for d in decs.values()}) == 1
    for op in ("qkv", "proj", "fc1", "fc2"):
        chosen = {rep: d["ops"][op]["config"]["case"] or "none" for rep, d in decs.items()}
        assert len({d["ops"][op]["tp"] for d in decs.values()}) == 1
        for rep, d in decs.items():
            others = set(chosen.values()) - {chosen[rep]}
            ties = {t["case"] for t in d["ops"][op]["ties"]}
            # a run whose choice differs from another's names that choice as a tie, or is named by it
            for o in others:
                other_rep = next(r for r, c in chosen.items() if c == o)
                named = {t["case"] for t in decs[other_rep]["ops"][op]["ties"]}
                assert o in ties or chosen[rep] in named, (op, rep, o)


def test_v2_rep3_on_another_machine_differs_only_where_its_search_saw_a_tie():
    """rep3 ran in a later session (another x2 lease): the same TP and the same proj/fc1/fc2 settings as
    rep1; qkv differs only in wgrad's num_sm, where rep3's step called sm4 vs sm8 a tie and rep1's called
    sm8 faster. The two intervals of that one comparison do not overlap: leases differ beyond a session's
    interval, so an answer at the margin is a tie, not a finding."""
    decs = {rep: json.loads((STABILITY_V2 / rep / "decisions.json").read_text()) for rep in ("rep1", "rep3")}
    assert decs["rep1"]["meta"]["model_tp"] == decs["rep3"]["meta"]["model_tp"] == 2
    for op in ("proj", "fc1", "fc2"):
        assert decs["rep1"]["ops"][op]["config"]["variant"] == decs["rep3"]["ops"][op]["config"]["variant"], op
    assert decs["rep1"]["ops"]["qkv"]["config"]["variant"].replace("wgrad.bulk.sm8", "wgrad.bulk.sm4") == \
        decs["rep3"]["ops"]["qkv"]["config"]["variant"]
    step = {rep: next(st for st in d["ops"]["qkv"]["searches"]["tp2/wgrad.bulk"] if st["compared"] == [4, 8])
            for rep, d in decs.items()}
    assert step["rep1"]["comparison"]["reason"] == "faster" and step["rep3"]["comparison"]["reason"].startswith("tie")
    assert step["rep3"]["comparison"]["ratio"]["hi"] < step["rep1"]["comparison"]["ratio"]["lo"]


@pytest.mark.parametrize("rep", REPS_V2)
def test_v2_harness_keeps_every_batch_fed_in_one_attempt(rep):
    """This session's harness on x2: op batches pass the lead check and 2-layer block batches the
    launch-queue check, each in its first attempt (the block took 4 attempts a round before)."""
    checks = {}
    for rj in (STABILITY_V2 / rep / "sessions").rglob("run.json"):
        r = json.loads(rj.read_text())
        for b in r["host"]["batches"]:
            key = ("layer" if r["case"].startswith("layer-") else "op", b["check"], b["attempts"])
            checks[key] = checks.get(key, 0) + 1
    want = {("op", "lead", 1)} | ({("layer", "queue", 1)} if (STABILITY_V2 / rep / "layer").exists() else set())
    assert set(checks) == want, checks


def test_knob_search_records_its_cost_against_the_grid():
    dec = json.loads((KNOBS / "decisions.json").read_text())
    for op in ("qkv", "proj", "fc1", "fc2"):
        ks = dec["ops"][op]["knob_search"]["2"]
        cost = ks["cost"]
        assert cost["grid_size"] > 1000 and 0 < cost["gpu_s"] < 0.25 * cost["grid_gpu_s_est"], (op, cost)
        assert ks["reference"] in ("te", "nemo_tp4", "nvidia_bf16_tp2")


def test_fp8_runs_bound_below_no_overlap_and_blocks_pass_numerics():
    """The FP8 runs (delayed, current scaling): the bound, the no-overlap layer with local collectives, is
    not above no overlap for fc1/fc2 beyond the noise; every overlapped op setting passes TE's FP8
    criterion against its primed reference; every block passes the check with the reference's own
    pass-to-pass floor, so the block stage has a winner."""
    for run in (FP8, FP8_CURRENT):
        dec = json.loads((run / "decisions.json").read_text())
        assert dec["meta"]["workload"]["dtype"] == "fp8"
        for f in dec["meta"]["measurement"]["bound_faults"]:
            # current scaling: fc2's bound had one slow first round (6.19 against 4.89-5.06 ms), flagged by
            # its estimate (> the margin) with an interval that spans 1: reported, not hidden
            assert run == FP8_CURRENT and f["bound"] == "fc2-tp2-nocomm" and f["lo"] < 1 < f["hi"], f
        for sj in (run / "sessions").glob("*/tp2/point/session.json"):
            sess = json.loads(sj.read_text())
            for c, p in sess["runs"].items():
                r = json.loads((sj.parent / p).read_text())
                assert r["status"] == "ok" and r["correctness"]["ok"], c
                if "-ub." in c:
                    assert r["correctness"]["rtol"] == 0.125 and "primed" in r["correctness"]["criterion"]
        layer = dec["meta"]["layer"]["2"]
        assert layer["winner"] and layer["numerics_failed"] is False
        sess = json.loads((run / "sessions" / "layer" / "tp2" / "session.json").read_text())
        for c, p in sess["runs"].items():
            corr = json.loads((run / "sessions" / "layer" / "tp2" / p).read_text())["correctness"]
            assert corr["ok"], c
            if "-ub." in c:   # the input gradient fails TE's rule alone, as no overlap does against itself
                assert corr["floor_abs_err"]["input"] > 0 and corr["max_abs_err"]["output"] <= 2 * corr["floor_abs_err"]["output"]
        assert "WARNING" not in (run / "tp_comm_overlap_cfg.yaml").read_text()
    # current scaling, with every batch host-ahead now: the tuned combination ties NVIDIA's FP8 preset on
    # the block (the run before the pre-roll fix, whose qkv/proj figures were host time, picked the preset)
    layer = json.loads((FP8_CURRENT / "decisions.json").read_text())["meta"]["layer"]["2"]
    nv = next(r for r in layer["settings"] if r["variant"] == "ub.nvidia_fp8_tp2")
    assert layer["winner"] == "layer-tp2-ub.tuned_tp2" and nv["tuned_vs"]["ratio"]["lo"] < 1 < nv["tuned_vs"]["ratio"]["hi"]


def test_host_bound_retries_get_the_host_ahead():
    """FP8 current scaling at TP 2: qkv/proj launch for longer than the GPU runs them. Before the retry
    shortened the pre-roll, none of their batches got the host ahead; now every batch does, those that
    needed it on a second attempt with a quarter of the pre-roll (60 -> 15 iterations)."""
    seen = set()
    for rj in (FP8_CURRENT / "sessions").glob("*/tp2/point/*/run.json"):
        r = json.loads(rj.read_text())
        assert r["host"]["host_ahead"] is True, r["case"]
        for b in r["host"]["batches"]:
            assert b["check"] == "lead"
            seen.add((r["op"], b["attempts"], b["preroll"]))
    assert ("qkv", 2, 15) in seen and ("proj", 2, 15) in seen
    assert all(a == 1 for op, a, _ in seen if op in ("fc1", "fc2"))


def test_block_numerics_floor_figures():
    """benchmarks/block_numerics_floor.py on x2: two no-overlap blocks differ in the input gradient (not
    the output), by as much as no overlap and ub.te differ."""
    floor = ROOT / "results" / "block-numerics-floor-x2"
    for name in ("floor-bf16-x.json", "floor-fp8-current.json", "floor-fp8-delayed.json"):
        rows = json.loads((floor / name).read_text())["rows"]
        twin, ub = rows["none (second block)"], rows["ub.te"]
        assert twin["output"]["abs"] == 0.0 and ub["output"]["abs"] == 0.0
        assert twin["input"]["abs"] > 0 and ub["input"]["abs"] <= 2 * max(twin["input"]["abs"],
                                                                          rows["none (same block again)"]["input"]["abs"])


def test_report_says_which_op_figures_are_not_gpu_time(tmp_path):
    """A run whose qkv/proj batches never got the host ahead (the FP8 current-scaling run as it was before
    the pre-roll fix: its qkv and proj run.json files marked so) gets a per-op note in the report rendered
    by this checkout; a run where every batch did (the bf16 rep3, the FP8 run as measured) gets none."""
    import shutil

    from tptune.cli.rederive import rederive

    for src, want in ((FP8_CURRENT, {"qkv", "proj"}), (STABILITY_V2 / "rep3", set()), (FP8_CURRENT, set())):
        run = tmp_path / f"{src.name}-{len(want)}"
        shutil.copytree(src, run)
        for rj in (run / "sessions").glob("*/tp2/point/*/run.json"):
            r = json.loads(rj.read_text())
            if r["op"] in want:
                r["host"]["host_ahead"] = False
                for b in r["host"]["batches"]:
                    b.update(host_ahead=False, check="failed")
                rj.write_text(json.dumps(r))
        rederive(_settings(run), RunDir(run))
        text = (run / "report.md").read_text()
        got = {op for op in ("qkv", "proj", "fc1", "fc2") if f"**{op}: not GPU time" in text}
        assert got == want


def test_knob_runs_emit_the_reduce_scatter_dgrad_and_beat_nvidia_on_the_block():
    """The knob search with the column ops' reduce-scatter dgrad (issue 12), twice on one lease: both runs
    emit the same file (every GEMM a copy-engine ring exchange, qkv/fc1 dgrad reduce-scatters, no wgrad
    overlap) with Megatron's tp_comm_overlap_rs_dgrad on and bulk off; on the block the tuned file is
    faster than NVIDIA's TP=2 preset beyond the margin in the first run ([0.966, 0.978] of its time:
    >= 1.02x) and by 2.2% (0.978, interval reaching 0.986) in the second; every block passed numerics."""
    files = []
    for run in (KNOBS, KNOBS_REP2):
        cfg = yaml.safe_load((run / "tp_comm_overlap_cfg.yaml").read_text())
        files.append(cfg)
        assert "qkv_wgrad" not in cfg and "fc1_wgrad" not in cfg
        assert {e["method"] for e in cfg.values()} == {"ring_exchange"} and all(e["use_ce"] for e in cfg.values())
        sw = yaml.safe_load((run / "transformer_config_overrides.yaml").read_text())
        assert sw["tp_comm_overlap_rs_dgrad"] is True and sw["tp_comm_bulk_dgrad"] is sw["tp_comm_bulk_wgrad"] is False
        assert "--tp-comm-overlap-rs-dgrad" in (run / "megatron_flags.txt").read_text()
        layer = json.loads((run / "decisions.json").read_text())["meta"]["layer"]["2"]
        assert layer["winner"] == "layer-tp2-ub.tuned_tp2"
        rows = {r["variant"]: r for r in layer["settings"]}
        assert all(r["correct"] for r in rows.values())
        nv = rows["ub.nvidia_bf16_tp2"]["tuned_vs"]["ratio"]
        assert nv["ratio"] < 0.98 and nv["hi"] < 0.99
    assert files[0] == files[1]
    first = json.loads((KNOBS / "decisions.json").read_text())["meta"]["layer"]["2"]
    assert next(r for r in first["settings"] if r["variant"] == "ub.nvidia_bf16_tp2")["tuned_vs"]["ratio"]["hi"] < 0.98


def _verify_ratio(folder, op, a, b):
    from tptune.stats.noise import compare_points
    from tptune.records.sessions import load_session

    runs = load_session(RS_DGRAD / folder / "sessions" / op / "tp2").points
    return compare_points(runs[f"{op}-tp2-{a}"], runs[f"{op}-tp2-{b}"], floor=0.02, tie="b").ratio


def test_rs_dgrad_experiment_and_the_emitted_file_checked_by_verify():
    """tptune verify on x2: (experiment) the earlier tuned file with qkv/fc1 dgrad as ring-exchange
    reduce-scatters passes numerics bit-for-bit and makes qkv 4.6% faster; as pipelined reduce-scatters
    it fails the numerics check on the ops and on the block (so the search offers ring_exchange only).
    (emitted) the knob run's file against NVIDIA's preset, a session of its own: block 0.979 [0.971, 0.988]."""
    exp = json.loads((RS_DGRAD / "experiment" / "verify.json").read_text())
    num = {r["setting"]: r["numerics"] for r in exp["block"]["rows"]}
    assert num["ub.user2"] is True and num["ub.user3"] is False
    for op in ("qkv", "fc1"):
        rows = {r["setting"]: r for r in exp["ops"][op]["rows"]}
        assert rows["ub.user2"]["numerics"] is True and rows["ub.user3"]["numerics"] is False
    assert _verify_ratio("experiment", "qkv", "ub.user2", "ub.user1").hi < 0.98
    blk = _verify_ratio("emitted", "layer", "ub.user1", "ub.nvidia_bf16_tp2")
    assert blk.ratio < 0.98 and blk.hi < 0.99
    for op in ("qkv", "fc1"):     # no longer slower than NVIDIA's preset: ties
        r = _verify_ratio("emitted", op, "ub.user1", "ub.nvidia_bf16_tp2")
        assert r.lo < 1.0 and r.hi <= 1.01
    for op in ("proj", "fc2"):
        assert _verify_ratio("emitted", op, "ub.user1", "ub.nvidia_bf16_tp2").hi < 0.96


def test_noise_with_clocks_no_overlap_stays_within_the_target_and_ub_te_steps():
    """benchmarks/measure_noise.py with NVML clocks: every GPU-timed batch has its SM clock and ran under
    the power cap; no overlap spreads <= 2.5% over 7 calls on every op, ub.te's qkv 17.9% with
    level steps inside single batches, not explained by the clock (its cycles spread as much)."""
    d = json.loads((ROOT / "results" / "noise-x2" / "noise-clock.json").read_text())
    assert d["against"] == "none"
    spread = lambda xs: max(xs) / min(xs) - 1
    for op in ("qkv", "proj", "fc1", "fc2"):
        none = d["calls"][f"{op}/gpu:none"]
        assert len(none) == 7 and spread([r["ms"] for r in none]) <= 0.025
        for r in d["calls"][f"{op}/gpu"] + none:
            clock = r["batches"][0]["clock"]
            assert r["sm_mhz"] and "sw_power_cap" in clock["reasons"] and r["batches"][0]["check"] == "lead"
    qkv = d["calls"]["qkv/gpu"]
    assert spread([r["ms"] for r in qkv]) > 0.15
    assert spread([r["ms"] * r["sm_mhz"] for r in qkv]) >= spread([r["ms"] for r in qkv])
    worst = max(qkv, key=lambda r: r["ms"])["iterations_ms"]
    assert worst[-1] / worst[0] > 1.05          # a step inside one batch


def test_noise_with_the_emitted_settings_steps_on_qkv_too():
    """The same benchmark with the knob run's emitted settings per op (a later lease): qkv steps between
    levels with the tuned setting as with ub.te, and no overlap stepped once inside a batch too."""
    d = json.loads((ROOT / "results" / "noise-x2" / "noise-tuned.json").read_text())
    assert d["variant"].startswith("qkv=ub.te+dgrad.ring")
    spread = lambda xs: max(xs) / min(xs) - 1
    assert spread([r["ms"] for r in d["calls"]["qkv/gpu"]]) > 0.10
    steps = [r["iterations_ms"] for r in d["calls"]["qkv/gpu:none"]]
    assert any(max(it) / min(it) > 1.04 for it in steps)
    assert all(r["batches"][0]["check"] == "lead" for k in d["calls"] if "/gpu" in k for r in d["calls"][k])


def test_recorded_steps_are_listed_and_a_longer_preroll_damps_them(tmp_path):
    """fc1 with no overlap in the knob run stepped up in the second half of every batch (power cap after
    ~250 ms of load): the rederived decisions list it; measure_noise with 1500 ms of pre-roll against
    150 ms, same lease: fc1 no overlap's worst within-batch step and ub.te qkv's call-to-call spread shrink."""
    import shutil

    from tptune.cli.rederive import rederive

    run = tmp_path / KNOBS.name
    shutil.copytree(KNOBS, run)
    rederive(_settings(run), RunDir(run))
    m = json.loads((run / "decisions.json").read_text())["meta"]["measurement"]
    assert "fc1-tp2-none" in m["stepped"] and "proj-tp2-none" not in m["stepped"]
    assert "inside one batch" in (run / "report.md").read_text()
    noise = {p: json.loads((ROOT / "results" / "noise-x2" / f"noise-preroll{p}.json").read_text()) for p in (150, 1500)}
    step = {p: max(max(r["iterations_ms"]) / min(r["iterations_ms"]) - 1 for r in d["calls"]["fc1/gpu:none"])
            for p, d in noise.items()}
    spread = {p: max(r["ms"] for r in d["calls"]["qkv/gpu"]) / min(r["ms"] for r in d["calls"]["qkv/gpu"]) - 1
              for p, d in noise.items()}
    assert step[1500] < step[150] and spread[1500] < spread[150]
    assert noise[1500]["calls"]["fc1/gpu"][0]["batches"][0]["preroll"] > 5 * noise[150]["calls"]["fc1/gpu"][0]["batches"][0]["preroll"]


def _noise(name):
    return json.loads((ROOT / "results" / "noise-x2" / f"{name}.json").read_text())


def _worst_spread(d, modes=("gpu", "gpu:none")):
    """The largest max/min - 1 over 7 calls of any op's GPU-timed setting (every op here is >= 1 ms)."""
    out = {}
    for key, rows in d["calls"].items():
        op, mode = key.split("/")
        if mode in modes:
            xs = [r["ms"] for r in rows]
            out[key] = max(xs) / min(xs) - 1
    return max(out.values()), out


def test_a_500_ms_window_narrows_the_call_to_call_spread():
    """measure_noise on x2 with timing.window_ms 500 and then 0 (10 iterations), back to back on one lease;
    500 and 250 ms back to back on a later lease. ub.te and no overlap, 7 calls each, every op >= 1 ms."""
    w500, s500 = _worst_spread(_noise("noise-window500"))
    w0, s0 = _worst_spread(_noise("noise-window0"))
    assert w500 <= 0.032 and w0 > 0.10                    # 3.1% against 11.7% (qkv ub.te)
    assert s500["qkv/gpu"] < s0["qkv/gpu"] / 3 and s500["fc1/gpu:none"] < s0["fc1/gpu:none"] / 2
    c500, _ = _worst_spread(_noise("noise-lease3-window500-rounds2"))       # two builds per call, lease C
    assert c500 <= 0.03
    assert all(len(r["batches"]) == 2 for r in _noise("noise-lease3-window500-rounds2")["calls"]["qkv/gpu"])
    b500, _ = _worst_spread(_noise("noise-lease2-window500"))
    b250, _ = _worst_spread(_noise("noise-lease2-window250"))
    assert b500 <= 0.032 and b250 > 2 * b500              # 3.1% against 9.0%
    for name in ("noise-window500", "noise-lease2-window500"):
        for key, rows in _noise(name)["calls"].items():
            if key.split("/")[1].startswith("gpu"):
                for r in rows:
                    assert r["host_ahead"] and r["batches"][0]["check"] in ("lead", "queue")
                    # the window: ~500 ms of GPU time (its iterations are sized from the probe's GPU time)
                    assert len(r["iterations_ms"]) * r["ms"] >= 450


def test_inside_batch_steps_are_not_what_nvml_reports_as_the_sm_clock():
    """The per-iteration SM clock beside 40-iteration batches: qkv ub.te stepped by > 5% and fc2 no overlap
    by > 15% inside one batch while NVML's clock for those iterations moved by < 1%."""
    d = _noise("noise-iterclock40")

    def steps(key):
        for r in d["calls"][key]:
            its, mhz = r["iterations_ms"], r["iter_mhz"]
            idx = [i for i, c in enumerate(mhz) if c]
            lo, hi = min(idx, key=its.__getitem__), max(idx, key=its.__getitem__)
            yield its[hi] / its[lo] - 1, abs(mhz[hi] / mhz[lo] - 1)
    assert any(t > 0.05 and c < 0.01 for t, c in steps("qkv/gpu"))
    assert any(t > 0.15 and c < 0.01 for t, c in steps("fc2/gpu:none"))


STABILITY_V3 = ROOT / "results" / "stability-llama3-70b-x2-v3"


def test_stability_with_the_window_same_answers_or_named_ties():
    """Three runs of config/gpu/h200x2-llama3-70b.yaml in a row on one x2 lease with the 500 ms window: the
    same model TP and the same setting for proj, fc1, fc2; qkv's choices differ and the reports name them
    as ties; the bound below every setting of every TP point; every batch with the host ahead."""
    import csv

    dec = {r: json.loads((STABILITY_V3 / r / "decisions.json").read_text()) for r in REPS}
    assert {d["meta"]["model_tp"] for d in dec.values()} == {2}
    win = {r: {op: o["winner"]["case"] for op, o in d["ops"].items()} for r, d in dec.items()}
    for op in ("proj", "fc1", "fc2"):
        assert len({w[op] for w in win.values()}) == 1
    reports = {r: (STABILITY_V3 / r / "report.md").read_text() for r in REPS}
    ties = {r: next(line for line in rep.splitlines() if line.startswith("- qkv:")) for r, rep in reports.items()}
    assert f"`{win['rep3']['qkv']}`" in ties["rep1"] and f"`{win['rep1']['qkv']}`" in ties["rep3"]
    assert f"`{win['rep1']['qkv']}`" in ties["rep2"]
    for r in REPS:
        rows = [x for x in csv.DictReader((STABILITY_V3 / r / "measurements.csv").open()) if x["status"] == "ok"]
        assert len(rows) == 52 and all(x["host_ahead"] == "true" for x in rows)
        for sess in {x["session"] for x in rows if x["session"].endswith("/point")}:
            ms = {x["variant"]: float(x["median_ms"]) for x in rows if x["session"] == sess}
            assert all(ms["nocomm"] < v for k, v in ms.items() if k != "nocomm"), sess
        assert 180 <= int((STABILITY_V3 / r / "wall_s.txt").read_text()) <= 195


def test_the_emitted_file_still_beats_nvidia_on_the_block_with_the_window():
    """The knob run's file on the block, verified again with the 500 ms window harness (a later lease):
    0.978 [0.974, 0.982] of NVIDIA's tp2 preset over 6 rounds; every block batch counted in one attempt."""
    r = _verify_ratio("emitted-window", "layer", "ub.user1", "ub.nvidia_bf16_tp2")
    assert r.rounds == 6 and r.hi < 0.985
    from tptune.records.sessions import load_session

    runs = load_session(RS_DGRAD / "emitted-window" / "sessions" / "layer" / "tp2").points
    for p in runs.values():
        assert all(b["attempts"] == 1 and b["check"] == "queue" for b in p.host_batches)


STABILITY_V4 = ROOT / "results" / "stability-llama3-70b-x2-v4"
STABILITY_V4_STEP = ROOT / "results" / "stability-llama3-70b-x2-v4-step-margin-only"


def _stability_rows(run):
    import csv

    return [x for x in csv.DictReader((run / "measurements.csv").open()) if x["status"] == "ok"]


def test_stability_v4_same_answers_in_three_runs():
    """With decision.step_margin and search.runner_up: three runs in a row on one x2 lease give the same
    model TP (by the rule itself), TP per op and setting per op; the runner-ups were measured at the TP
    point; the bound below every setting of every TP point; every batch with the host ahead."""
    dec = {r: json.loads((STABILITY_V4 / r / "decisions.json").read_text()) for r in REPS}
    assert {(d["meta"]["model_tp"], d["meta"]["model_tp_rule"]) for d in dec.values()} == {(2, 2)}
    for op in ("qkv", "proj", "fc1", "fc2"):
        assert len({(d["ops"][op]["tp"], d["ops"][op]["config"]["variant"]) for d in dec.values()}) == 1, op
    assert dec["rep1"]["ops"]["qkv"]["config"]["variant"] == "ub.te+fprop.ring+dgrad.bulk.sm2+wgrad.bulk.sm8"
    for r, d in dec.items():
        cfg = json.loads((STABILITY_V4 / r / "config.json").read_text())
        assert cfg["decision"]["step_margin"] == 0.01 and cfg["search"]["runner_up"] is True
        rows = _stability_rows(STABILITY_V4 / r)
        assert len(rows) == 56 and all(x["host_ahead"] == "true" for x in rows)
        point = {x["variant"] for x in rows if x["session"] == "qkv/tp2/point"}
        assert {"ub.te+fprop.ring+dgrad.bulk.sm2+wgrad.bulk.sm4",
                "ub.te+fprop.ring+dgrad.bulk.sm2+wgrad.bulk.sm8"} <= point     # the runner-up's combination
        for sess in {x["session"] for x in rows if x["session"].endswith("/point")}:
            ms = {x["variant"]: float(x["median_ms"]) for x in rows if x["session"] == sess}
            assert all(ms["nocomm"] < v for k, v in ms.items() if k != "nocomm"), sess
        for step in d["ops"]["qkv"]["searches"]["tp2/wgrad.bulk"]:
            assert step["comparison"]["margin"] == 0.01 and step["comparison"]["tie_margin"] == 0.02
        assert int((STABILITY_V4 / r / "wall_s.txt").read_text()) <= 200


def test_stability_step_margin_alone_left_qkv_to_a_coin():
    """The triple before runner-ups (an earlier lease): qkv's wgrad 4 vs 8 SMs read 1.006-1.014 and two
    runs kept 4, one 8; three different qkv choices, and some pair is not named in the other's report."""
    dec = {r: json.loads((STABILITY_V4_STEP / r / "decisions.json").read_text()) for r in REPS}
    chosen = {r: d["ops"]["qkv"]["config"]["variant"] for r, d in dec.items()}
    assert len(set(chosen.values())) == 3
    kept = [d["ops"]["qkv"]["searches"]["tp2/wgrad.bulk"][-1]["kept"][0] for d in dec.values()]
    assert sorted(kept) == [4, 4, 8]
    ties = {r: {t["case"].split("tp2-", 1)[1] for t in d["ops"]["qkv"]["ties"]} for r, d in dec.items()}
    assert any(chosen[b] not in ties[a] for a in REPS for b in REPS if chosen[a] != chosen[b])
    for op in ("proj", "fc1", "fc2"):
        assert len({d["ops"][op]["config"]["variant"] for d in dec.values()}) == 1


def test_measure_noise_three_builds_per_call_meets_the_target_for_te_defaults():
    """measure_noise --rounds 3 (lease 4): TE-default ub_cfgs spread <= 2% for every op (worst 1.9%), no
    overlap beside it 3.2%: the target is met for the setting the issue names, not for every setting."""
    text = (ROOT / "results" / "noise-x2" / "noise-lease4-window500-rounds3.txt").read_text()
    assert "ub.te: worst 1.91% (met)" in text and "none: worst 3.24% (NOT met)" in text
    data = json.loads((ROOT / "results" / "noise-x2" / "noise-lease4-window500-rounds3.json").read_text())
    gpu = {r["op"]: r for r in data["summary"] if r["mode"] == "gpu"}
    assert set(gpu) == {"qkv", "proj", "fc1", "fc2"} and all(r["calls"] == 7 and r["host_ahead"] for r in gpu.values())
    assert all(r["median_ms"] >= 1 and r["spread"] <= 0.02 for r in gpu.values())
    assert max(r["spread"] for r in data["summary"] if r["mode"] == "gpu:none") > 0.03


TP24 = ROOT / "results" / "tp24-llama3-70b-h200x4"


def test_tp24_runs_repeat_their_files_and_the_pooled_tp4_block_is_the_readmes():
    """Three TP 2 + 4 runs in a row on 4x H200: the same model TP, per-op TPs and byte-identical files at
    both TPs; the TP 4 block pooled over the three (rep1/pooled_with.json) is the figure the READMEs quote."""
    metas = [json.loads((TP24 / r / "decisions.json").read_text()) for r in REPS]
    assert {m["meta"]["model_tp"] for m in metas} == {4}
    assert {tuple((op, rec["tp"]) for op, rec in m["ops"].items()) for m in metas} == \
        {(("qkv", 4), ("proj", 4), ("fc1", 4), ("fc2", 4))}
    for name in ("tp_comm_overlap_cfg.tp2.yaml", "tp_comm_overlap_cfg.tp4.yaml", "megatron_flags.tp2.txt",
                 "megatron_flags.tp4.txt", "transformer_config_overrides.tp4.yaml"):
        assert len({(TP24 / r / name).read_text() for r in REPS}) == 1, name
    pooled = metas[0]["meta"]["layer"]["4"]["pooled"]
    assert pooled["sessions"] == ["this run", "../rep2/sessions/layer/tp4", "../rep3/sessions/layer/tp4",
                                  "../rep4/sessions/layer/tp4"]
    recipe = pooled["pooled"]["ub.nemo_tp4_recipe"]
    assert recipe["pooled_sessions"] == 4 and recipe["rounds"] == 11
    assert (round(recipe["ratio"], 3), round(recipe["lo"], 3), round(recipe["hi"], 3)) == (0.980, 0.976, 0.983)
    assert "0.980 [0.976, 0.983]" in (TP24 / "README.md").read_text()
    assert [int((TP24 / r / "wall_s.txt").read_text()) for r in (*REPS, "rep4")] == [349, 317, 320, 364]


def test_tp24_rep4_measured_the_blocks_bound_and_wrote_the_faster_combination():
    """rep4 (a later lease, the same config) measured the block's own no-communication bound at both TPs;
    its tuned TP 4 combination is rep1-3's (so it pools with them), but the block found tptune's fastest
    combination faster beyond the noise, so the TP 4 file holds that one, and the report's account follows
    the written file."""
    rep4 = json.loads((TP24 / "rep4" / "decisions.json").read_text())["meta"]["layer"]
    for tp in ("2", "4"):
        bound = next(r for r in rep4[tp]["settings"] if r["variant"] == "nocomm")
        none = next(r for r in rep4[tp]["settings"] if r["variant"] == "none")
        assert bound["status"] == "ok" and bound["median_ms"] < none["median_ms"]
    assert rep4["4"]["winner"] == "layer-tp4-ub.fastest_tp4"
    fastest = next(r for r in rep4["4"]["settings"] if r["variant"] == "ub.fastest_tp4")
    assert fastest["tuned_vs"]["ratio"]["lo"] > 1.0
    def entries(path):   # the file without its comment header (which names each op's measured ms)
        return [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    tuned = [entries(TP24 / r / "presets" / "tuned_tp4.yaml") for r in ("rep1", "rep4")]
    assert tuned[0] == tuned[1]
    written = entries(TP24 / "rep4" / "tp_comm_overlap_cfg.tp4.yaml")
    assert "qkv_dgrad: {method: bulk, num_sm: 8, cga_size: 2, set_sm_margin: true}" in written
    # the answer's per-op line names each op's pick measured alone, so it must say the file holds another
    answer = (TP24 / "rep4" / "report.md").read_text().split("## ")[1]
    assert "the TP 4 file holds the block-level winner, tptune's fastest combination, instead" in answer
    assert "holds the block-level winner" not in (TP24 / "rep1" / "report.md").read_text().split("## ")[1]
    # and the figures a user of that file needs: it against each reference, from its block session
    assert "**The file on a 2-layer block at TP 4**: `layer-tp4-ub.fastest_tp4` / reference" in answer
    assert "| `nemo_tp4` | 0.970 [0.960, 0.979], 3 rounds | faster beyond the margin |" in answer
    assert "| the tuned combination | 0.988 [0.986, 0.990], 3 rounds |" in answer
    assert "**The file on a" not in (TP24 / "rep1" / "report.md").read_text()
