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


def test_verify_refuses_a_repeated_tp_and_its_help_says_one_per_run():
    """Issue 54 item 7: `verify --tp 2 --tp 4` measured TP 4 alone, silently. A cfg file is written for one TP,
    so verify takes one TP per run: a repeated single-valued option is refused before anything is read."""
    out = tptune("verify", "--model", "config/models/tiny.yaml", "--tp", "2", "--tp", "4", "--cfg", "x.yaml")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "argument --tp: given twice (2, then 4)" in out.stderr, out.stderr
    out = tptune("verify", "--model", "a.yaml", "--model", "b.yaml", "--tp", "2")
    assert out.returncode == 2 and "argument --model: given twice ('a.yaml', then 'b.yaml')" in out.stderr
    helped = " ".join(tptune("verify", "-h").stdout.split())
    assert "once per TP" in helped, helped
