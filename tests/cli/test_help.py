"""`tptune --help` lists the user commands apart from the workflow's internal steps, which stay callable;
`tptune --version` prints the package's version (issue 34, item 8)."""
import re
import subprocess
import sys
import tomllib

from conftest import ROOT

STEPS = {"search-step", "measure-step", "measure-point", "tp-point", "tp-step", "layer", "analyze-session",
         "collect", "decide", "report", "join-json", "check-run"}


def tptune(*args):
    return subprocess.run([sys.executable, "-m", "tptune", *args], capture_output=True, text=True, cwd=ROOT)


def test_help_lists_user_commands_apart_from_the_workflow_steps():
    out = tptune("--help")
    assert out.returncode == 0, out.stderr
    commands, _, steps = out.stdout.partition("workflow steps")
    assert steps, out.stdout
    listed = set(re.findall(r"^    ([a-z][a-z-]+)", commands, flags=re.M))
    assert {"validate", "verify", "failed", "rederive", "calibrate-window", "analyze"} <= listed
    assert not listed & STEPS, listed & STEPS
    assert STEPS <= set(re.findall(r"[a-z][a-z-]+", steps))


def test_workflow_steps_stay_callable():
    for step in ("decide", "measure-point", "check-run"):
        out = tptune(step, "-h")
        assert out.returncode == 0 and out.stdout.startswith(f"usage: tptune {step}"), (step, out.stderr)


def test_version_is_the_package_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    out = tptune("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"tptune {version}"
