"""The tiny CPU workflow end to end on a real one-node Slurm cluster, through profiles/slurm.

A cluster from Debian's packages (munge, MariaDB, slurmdbd, slurmctld, slurmd) is started on
localhost for this module and stopped after it (tests/slurm/cluster.py). Nothing is mocked: jobs go
through sbatch, the executor plugin reads their states from sacct, and accounting is checked here.

Needs root and the packages; under CI (CI=true) scripts/ci_slurm_setup.sh installs what is missing,
elsewhere the test fails and says how to install. A daemon that does not start fails the test with
its log.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from conftest import copy_workflow
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parents[1]))
from slurm.cluster import ClusterError, LocalSlurm, PACKAGES, missing_tools  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
MEASURE_RULES = ("measure_step", "measure_point", "layer")  # the measuring stage: one session a job
FAULT_CASE = "qkv-tp2-chunked.n4"                              # a worker rank exits mid-case


def _plugin_missing() -> bool:
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
        import snakemake_executor_plugin_slurm_jobstep  # noqa: F401
    except ImportError:
        return True
    return False


def _ensure_installed():
    if not missing_tools() and not _plugin_missing():
        return
    if os.environ.get("CI") == "true":
        res = subprocess.run(["bash", str(ROOT / "scripts" / "ci_slurm_setup.sh")], capture_output=True,
                             text=True, timeout=1200)
        if res.returncode != 0:
            pytest.fail(f"scripts/ci_slurm_setup.sh failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        import importlib
        importlib.invalidate_caches()
    missing = missing_tools() + (["snakemake-executor-plugin-slurm"] if _plugin_missing() else [])
    if missing:
        pytest.fail(f"the Slurm test needs {', '.join(missing)}: as root, `apt-get install -y {PACKAGES}` and "
                    "`pip install -e '.[slurm]'` (both: bash scripts/ci_slurm_setup.sh)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the Slurm test starts slurmd and friends, which needs root")
    _ensure_installed()
    cl = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    t0 = time.monotonic()
    try:
        cl.start()
    except ClusterError as exc:
        cl.stop()
        pytest.fail(f"the local Slurm cluster did not start:\n{exc}")
    cl.start_s = time.monotonic() - t0
    yield cl
    cl.stop()


def _env(cl: LocalSlurm, shims: Path) -> dict:
    env = cl.env()
    # The jobstep plugin runs `srun` with every SLURM_* variable removed, SLURM_CONF included; a site
    # has its slurm.conf where clients look by default, this private cluster does not: a shim srun
    # puts SLURM_CONF back. The environment's own bin folder comes first (tptune, snakemake).
    env["PATH"] = os.pathsep.join([str(shims), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _shims(cl: LocalSlurm, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    srun = where / "srun"
    srun.write_text(f"#!/bin/sh\nexport SLURM_CONF={cl.conf}\nexec {shutil.which('srun')} \"$@\"\n")
    srun.chmod(0o755)
    return where


def _snakemake(workdir: Path, env: dict, *args: str, timeout: float = 1500) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--configfile", "run.yaml",
                        "--slurm-init-seconds-before-status-checks", "7", *args],
                       cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("wf")
    copy_workflow(work)
    # The repo's default config on the torch backend, with one injected failure. TP stays at 2: on two
    # busy cores the TP=4 decision is noise, and it would only lengthen the run.
    (work / "run.yaml").write_text(yaml.safe_dump({
        "backend": "torch", "tp_sizes": [2], "launcher": {"pool_dir": str(work / "pool")},
        "faults": {FAULT_CASE: "exit:1"}}))
    env = _env(cluster, _shims(cluster, work / "bin"))
    p, wall = _snakemake(work, env)
    log = p.stdout + p.stderr
    (work / "snakemake.log").write_text(log)
    if p.returncode != 0:
        pytest.fail(f"snakemake --profile profiles/slurm failed ({p.returncode}) after {wall:.0f}s:\n"
                    f"{log[-6000:]}\n{cluster.logs(1500)}")
    m = re.search(r"SLURM run ID: (\S+)", log)
    assert m, log[-3000:]
    run_dirs = list((work / "outputs").iterdir())
    assert len(run_dirs) == 1
    return {"work": work, "env": env, "log": log, "wall_s": wall, "uuid": m.group(1), "run": run_dirs[0],
            "cluster": cluster}


def _sacct(cl: LocalSlurm, uuid: str) -> list[dict]:
    out = cl.client("sacct", "-X", "-n", "-P", "-S", "now-1days", f"--name={uuid}",
                    "-o", "JobID,JobName,State,ExitCode,Comment%400").stdout
    rows = [dict(zip(("id", "name", "state", "exit", "comment"), line.split("|", 4)))
            for line in out.splitlines() if line.strip()]
    return rows


def _is_measure(comment: str) -> bool:
    return any(re.search(rf"(^|_){r}(_|$)", comment) for r in MEASURE_RULES)


def _runs(run_dir: Path) -> list[dict]:
    """Every setting's run.json of every session (a setting measured in two sessions counts twice)."""
    return [json.loads(p.read_text()) for p in sorted((run_dir / "sessions").glob("*/tp*/**/run.json"))]


def test_report_written_and_jobs_in_accounting(slurm_run):
    run = slurm_run["run"]
    report = (run / "report.md").read_text()
    assert "| qkv |" in report and "| fc2 |" in report
    rows = _sacct(slurm_run["cluster"], slurm_run["uuid"])
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", slurm_run["log"])
    assert rows and sorted(r["id"] for r in rows) == sorted(set(submitted))
    assert all(r["state"] == "COMPLETED" for r in rows), rows   # a failed case does not fail its job
    print(f"\nslurm run: {len(rows)} Slurm jobs, {slurm_run['wall_s']:.0f}s "
          f"(cluster start {slurm_run['cluster'].start_s:.0f}s)")


def _group_jobs(log: str) -> list[list[tuple[str, dict]]]:
    """The member jobs of each measurement group job the snakemake log announces: [(rule, wildcards)].
    A group's block is its header line and the indented lines under it, up to the next Snakemake record
    ("[<time>] ..."); the plugin's own unindented lines from another thread ("Job ... has been
    submitted", "No SLURM account given ...") may fall in between."""
    groups, current = [], None
    for line in log.splitlines():
        if re.search(r"\] Group job (measure|layer)-\S+ \(jobs", line):
            current = []
            groups.append(current)
        elif current is not None and line.startswith("["):
            current = None
        elif current is not None:
            m = re.match(r"\s+(?:local)?(?:rule|checkpoint) (\w+):$", line)
            if m:
                current.append((m.group(1), {}))
            m = re.match(r"\s+wildcards: (.+)$", line)
            if m and current:
                current[-1][1].update(kv.split("=", 1) for kv in m.group(1).split(", "))
    return groups


def test_one_slurm_job_per_group_not_per_case(slurm_run):
    rows = _sacct(slurm_run["cluster"], slurm_run["uuid"])
    measure_jobs = [r for r in rows if _is_measure(r["comment"])]
    groups = _group_jobs(slurm_run["log"])
    runs = _runs(slurm_run["run"])
    assert len(measure_jobs) == len(groups) > 0
    assert len(measure_jobs) < len(runs), (len(measure_jobs), len(runs))
    # a submission carries sessions of one TP point (or one TP's block), and every measuring job ran in one
    for jobs in groups:
        assert {r for r, _ in jobs} <= set(MEASURE_RULES)
        assert len({(wc.get("op"), wc["tp"]) for _, wc in jobs}) == 1
    assert sum(len(g) for g in groups) == sum(r["rule"] in MEASURE_RULES for r in _jobs_run(slurm_run["log"]))
    # start-up paid once per submission: later settings and rounds reach an already warm worker group
    ok = [r for r in runs if r["status"] == "ok"]
    reused = [r for r in ok if not r["launch"]["server_started"]]
    assert reused
    print(f"\nprofiling stage: {len(measure_jobs)} Slurm jobs for {len(runs)} cases "
          f"({sum(len(g) for g in groups)} Snakemake jobs); {len(reused)} of {len(ok)} measured cases "
          "on an already warm worker group")


def _jobs_run(log: str) -> list[dict]:
    """Every job the host snakemake scheduled (grouped or not), by rule."""
    return [{"rule": m} for m in re.findall(r"^\s*(?:rule|checkpoint) (\w+):$", log, re.M)]


def test_cases_run_in_their_own_submission(slurm_run):
    """Warm worker groups and GPU locks live in a folder per allocation (gpupool.pool_scope), so a
    setting never reaches a group another submission started on its GPUs."""
    rows = _sacct(slurm_run["cluster"], slurm_run["uuid"])
    measure_ids = {r["id"] for r in rows if _is_measure(r["comment"])}
    by_job = defaultdict(set)
    for r in _runs(slurm_run["run"]):
        if r["status"] == "ok":
            sched = r["environment"]["scheduler"]
            assert sched and sched["job_id"] in measure_ids, r["case"]
            by_job[sched["job_id"]].add((r["op"], r["tp"]))
    assert all(len(points) == 1 for points in by_job.values()), dict(by_job)


def test_failed_case_recorded_rest_finishes(slurm_run):
    run = slurm_run["run"]
    rec = json.loads((run / "sessions" / "qkv" / "tp2" / "chunks" / "step0" / "chunked.n4" / "run.json").read_text())
    assert rec["status"] == "failed"
    assert rec["error"]["kind"] in ("rank_died", "exception") and rec["error"]["message"]
    assert len(rec["attempts"]) >= 1
    ok = [r for r in _runs(run) if r["status"] == "ok"]
    assert {r["op"] for r in ok} >= {"qkv", "proj", "fc1", "fc2"}
    failed = subprocess.run(["tptune", "failed", str(run)], capture_output=True, text=True,
                            env=slurm_run["env"], cwd=slurm_run["work"])
    # the measuring output of the failed session: snakemake -R on it re-measures the session
    assert failed.stdout.split() == [str(run / "sessions" / "qkv" / "tp2" / "chunks" / "step0" / "session.json")]


def test_safety_environment_in_every_slurm_case(slurm_run):
    from tptune.measure.envinfo import SAFE_ENV
    for r in _runs(slurm_run["run"]):
        if r["status"] != "ok":
            continue
        env = r["environment"]
        assert env["env"] == SAFE_ENV, (r["case"], env["env"])
        assert env["scheduler"]["job_id"]


def test_rerun_submits_nothing(slurm_run):
    before = _sacct(slurm_run["cluster"], slurm_run["uuid"])
    p, _ = _snakemake(slurm_run["work"], slurm_run["env"], timeout=600)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-3000:]
    assert "Nothing to be done" in log
    assert "has been submitted" not in log
    uuid = re.search(r"SLURM run ID: (\S+)", log)
    assert uuid is None or not _sacct(slurm_run["cluster"], uuid.group(1))
    assert len(_sacct(slurm_run["cluster"], slurm_run["uuid"])) == len(before)


def test_gpu_ids_come_from_the_allocation(cluster, tmp_path):
    """Two jobs granted 2 and 3 of the node's (stand-in) GPUs each see exactly their own."""
    code = ("import json; from tptune.measure import gpupool; "
            "print(json.dumps({'granted': gpupool.scheduler_gpu_ids(), 'scope': gpupool.pool_scope()}))")
    outs, ids = [], []
    for n in (2, 3):
        out = tmp_path / f"gpus{n}.out"
        outs.append(out)
        ids.append(cluster.client("sbatch", "--parsable", f"--gres=gpu:{n}", "-c", "1", "--mem", "200",
                                  "-o", str(out), "--wrap", f"{sys.executable} -c \"{code}\"",
                                  check=True).stdout.strip())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(o.exists() and o.read_text().strip() for o in outs):
        time.sleep(0.5)
    got = [json.loads(o.read_text().strip().splitlines()[-1]) for o in outs]
    assert [len(g["granted"]) for g in got] == [2, 3]
    assert not set(got[0]["granted"]) & set(got[1]["granted"])
    assert got[0]["scope"] == f"slurm-{ids[0]}"
