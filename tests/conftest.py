import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
CPU_RUN = FIXTURES / "cpu" / "tiny-default"


def rederived(tmp_path, src=CPU_RUN, edit=None):
    """A scratch copy of the run ``src`` (``edit``-ed, if given) re-derived with `tptune rederive`:
    (its folder, its report.md)."""
    run = tmp_path / "run"
    shutil.copytree(src, run)
    if edit:
        edit(run)
    p = subprocess.run([sys.executable, "-m", "tptune", "rederive", str(run)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return run, (run / "report.md").read_text()


def copy_workflow(dst: Path) -> Path:
    """A copy of the workflow (Snakefile, rules, config, profiles, envs) in ``dst``."""
    for name in ("Snakefile", "rules", "config", "profiles", "envs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name)
    return dst


@pytest.fixture
def workdir(tmp_path):
    """A copy of the workflow in a fresh folder."""
    return copy_workflow(tmp_path)


@pytest.fixture
def pool_dir(tmp_path):
    d = tmp_path / "pool"
    d.mkdir()
    return d


def base_config(pool_dir, **over):
    from tptune.settings.resolve import deep_merge, load_config_files

    cfg = load_config_files(ROOT / "config" / "config.yaml")
    cfg["model"] = str(ROOT / "config" / "models" / "tiny.yaml")
    cfg["launcher"].update(pool_dir=str(pool_dir), idle_timeout_s=5, case_timeout_s=60)
    cfg["timing"] = {"warmup": 1, "iters": 3, "min_rounds": 2, "max_rounds": 2, "profile_steps": 1}
    return deep_merge(cfg, over)


os.environ.setdefault("OMP_NUM_THREADS", "1")
