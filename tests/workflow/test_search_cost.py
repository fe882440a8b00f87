"""Search-cost benchmark on the tiny CPU model: the binary search against the exhaustive grid of the
same space (chunk counts of fc1 at TP=2), both through the real workflow, then benchmarks/search_cost.py."""
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, base_config

pytestmark = pytest.mark.slow
CHUNKS = [2, 4, 8, 16]


def _run(workdir, pool, mode):
    # the search's cost is the subject: no layer stage (it measures the same block after either search)
    cfg = base_config(pool, run=f"cost-{mode}", ops=["fc1"], tp_sizes=[2], search={"mode": mode, "chunks": CHUNKS},
                      layer={"enabled": False})
    cfg["model"] = "config/models/tiny.yaml"
    (workdir / f"{mode}.yaml").write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", f"{mode}.yaml"],
                       cwd=workdir, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return workdir / "outputs" / f"cost-{mode}"


def test_bisect_against_grid(workdir, pool_dir):
    bisect, grid = _run(workdir, pool_dir, "bisect"), _run(workdir, pool_dir, "grid")
    measured = lambda run: sorted({p.parent.name for p in (run / "sessions/fc1/tp2/chunks").glob(  # noqa: E731
        "step*/chunked.*/run.json")})
    assert measured(grid) == sorted(f"chunked.n{n}" for n in CHUNKS)
    assert len(list((grid / "sessions/fc1/tp2/chunks").glob("step*/session.json"))) == 1  # one side-by-side session
    assert 2 <= len(measured(bisect)) < len(CHUNKS)
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/search_cost.py"), "--search", str(bisect),
                        "--grid", str(grid), "--op", "fc1", "--tp", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    print(p.stdout)
    assert "search/grid GPU-seconds" in p.stdout and "search winner in the grid session" in p.stdout
