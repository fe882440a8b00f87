"""Run configs that passed `tptune validate` and broke later (issue 54 items 3, 5, 6): non-finite numbers,
`launcher.env` of any value, YAML alias bombs, an empty or relative pool folder, a pool folder that cannot be
made, a run name too long for a folder, an empty run config. Each is refused at validation (the CLI's
`validate`, and `resolve_here`, which the Snakefile's parse calls), naming the field or the file."""
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, base_config
from tptune.errors import ConfigError
from tptune.measure.preflight import resolve_here
from tptune.settings.resolve import load_config_files, load_run_config

TINY = str(ROOT / "config" / "models" / "tiny.yaml")


def _refused(cfg, *expect, check_hardware=False):
    with pytest.raises(ConfigError) as e:
        resolve_here(cfg, check_hardware=check_hardware)
    for text in expect:
        assert text in str(e.value), str(e.value)
    return str(e.value)


# -- item 3: NaN and inf ----------------------------------------------------------------------------------

@pytest.mark.parametrize("over, field", [
    ({"decision": {"min_hidden_fraction": float("nan")}}, "decision.min_hidden_fraction"),
    ({"decision": {"noise_floor": float("nan")}}, "decision.noise_floor"),
    ({"decision": {"tp_tolerance": float("inf")}}, "decision.tp_tolerance"),
    ({"hardware": {"gpu_memory_gb": float("-inf")}}, "hardware.gpu_memory_gb"),
    ({"timing": {"window_ms": float("nan")}}, "timing.window_ms"),          # a number inside anyOf
    ({"op_settings": {"qkv": {"timing": {"preroll_ms": float("inf")}}}}, "op_settings.qkv.timing.preroll_ms"),
    ({"search": {"knobs": {"groups": [float("nan")]}}}, "search.knobs.groups.0"),   # a block the schema leaves open
    ({"parallel": {"dp": float("inf")}}, "parallel.dp"),                    # a field with no type
])
def test_a_non_finite_number_is_refused_in_every_field(pool_dir, over, field):
    _refused(base_config(pool_dir, **over), f"field '{field}'", "not a finite number")


def test_nan_from_a_yaml_file_is_refused_by_validate(tmp_path):
    """The CLI as a user runs it; before: `ok`, then decide died ("Out of range float values are not JSON
    compliant") after measuring everything."""
    run = tmp_path / "nan.yaml"
    run.write_text(f"model: {TINY}\ndecision: {{min_hidden_fraction: .nan, tp_tolerance: .inf}}\n")
    p = subprocess.run([sys.executable, "-m", "tptune", "validate", str(run)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={"TPTUNE_SUBMIT_ONLY": "1", **_env()})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "field 'decision.min_hidden_fraction': nan is not a finite number" in p.stderr, p.stderr
    assert "field 'decision.tp_tolerance': inf is not a finite number" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def _env():
    import os
    return {k: v for k, v in os.environ.items() if k != "TPTUNE_SUBMIT_ONLY"}


# -- item 5: launcher.env and alias bombs -----------------------------------------------------------------

@pytest.mark.parametrize("env, expect", [
    ({"FOO": [1]}, "field 'launcher.env.FOO': [1] is not of type 'string' or 'number'"),
    ({"FOO": {"a": 1}}, "field 'launcher.env.FOO'"),
    ({"FOO": None}, "field 'launcher.env.FOO': None is not of type 'string' or 'number'"),
    ({"FOO": True}, "field 'launcher.env.FOO': True is not of type 'string' or 'number'"),
    ({1: "x"}, "field 'launcher.env.1': the name 1 is not of type 'string'"),
    ({"A B": "x"}, "field 'launcher.env.A B': the name 'A B' does not match"),
])
def test_launcher_env_takes_variable_names_and_strings_or_numbers(pool_dir, env, expect):
    _refused(base_config(pool_dir, launcher={"env": env}), expect)


def test_launcher_env_of_strings_and_numbers_is_taken(pool_dir):
    s = resolve_here(base_config(pool_dir, launcher={"env": {"NCCL_DEBUG": "INFO", "UB_TIMEOUT": 110, "X_1": 0.5}}))
    assert s.launcher.env == {"NCCL_DEBUG": "INFO", "UB_TIMEOUT": 110, "X_1": 0.5}


BOMB = """\
  A: &a ["x","x","x","x","x","x","x","x","x","x"]
  B: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
  C: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
  D: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
  E: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
  F: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
  G: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]
  H: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g,*g]
  I: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_an_alias_bomb_is_refused_naming_the_file(tmp_path):
    """Before: validate passed and `snakemake -n` exhausted memory dumping the config. The merged config
    (what Snakemake hands the Snakefile) is refused too, naming the field; an alias used sanely is kept."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(f"model: {TINY}\nfaults:\n{BOMB}")
    with pytest.raises(ConfigError) as e:
        load_run_config([bomb])
    assert str(bomb) in str(e.value) and "aliases" in str(e.value), str(e.value)
    merged = yaml.safe_load(bomb.read_text())
    with pytest.raises(ConfigError, match=r"field 'faults.I': its YAML aliases expand it by 1,111,111,"):
        resolve_here({**load_config_files(ROOT / "config" / "config.yaml"), **merged}, check_hardware=False)
    sane = tmp_path / "sane.yaml"
    sane.write_text(f"model: {TINY}\ntiming: &t {{iters: 4}}\nop_settings: {{qkv: {{timing: *t}}, fc1: {{timing: *t}}}}\n")
    assert load_run_config([sane])[0]["op_settings"]["fc1"]["timing"] == {"iters": 4}


def test_snakemake_dry_run_refuses_an_alias_bomb_under_launcher_env(workdir, pool_dir):
    """The reported case, end to end: a bomb under launcher.env (Snakemake loads it without expanding a list
    alias); before, `snakemake -n` ran out of memory writing the config out. Refused at parse time, in seconds."""
    run = workdir / "bomb.yaml"
    run.write_text(f"model: {TINY}\nlauncher:\n  pool_dir: {pool_dir}\n  env:\n{BOMB}")
    p = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(run)],
                       cwd=workdir, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "its YAML aliases expand it by" in out, out[-3000:]
    assert "bomb.yaml" in out or "field 'launcher.env.I'" in out, out[-3000:]   # the file, or the field


def test_a_recursive_alias_is_refused(tmp_path):
    f = tmp_path / "loop.yaml"
    f.write_text(f"model: {TINY}\nfaults: &x {{a: *x}}\n")
    with pytest.raises(ConfigError, match="refers to itself"):
        load_run_config([f])


# -- item 6: settings that broke later than they should --------------------------------------------------

@pytest.mark.parametrize("pool", ["", "  ", "pool", "./tptune-pool"])
def test_an_empty_or_relative_pool_dir_is_refused(pool_dir, pool):
    """Before: '' put the pool in the checkout root (the folder snakemake ran in)."""
    _refused(base_config(pool_dir, launcher={"pool_dir": pool}), "field 'launcher.pool_dir'", "absolute path")


def test_a_pool_dir_that_cannot_be_made_is_refused_naming_the_setting(tmp_path, pool_dir):
    """Before: /proc/nope passed validate and the run's error never named the setting. A file in the way
    is refused too (a path any user, root included, cannot make a folder at)."""
    _refused(base_config(pool_dir, launcher={"pool_dir": "/proc/nope"}), "launcher.pool_dir", "/proc/nope",
             check_hardware=True)
    (tmp_path / "afile").write_text("")
    _refused(base_config(pool_dir, launcher={"pool_dir": str(tmp_path / "afile" / "pool")}), "launcher.pool_dir",
             check_hardware=True)
    # not checked where the hardware is not (snakemake -n, a submit host, a step reading records)
    assert resolve_here(base_config(pool_dir, launcher={"pool_dir": "/proc/nope"}), check_hardware=False)


def test_a_run_name_too_long_for_a_folder_is_refused(pool_dir):
    """Before: 300 characters passed validate and died in Snakemake ("File name too long")."""
    _refused(base_config(pool_dir, run="r" * 300), "field 'run'", "300 characters", "at most 128")
    assert resolve_here(base_config(pool_dir, run="r" * 128)).run == "r" * 128


def test_an_empty_run_config_is_refused_naming_the_file(tmp_path):
    """Before: validate passed it and snakemake refused it ("Config file must be given as JSON or YAML with
    keys at top level")."""
    for text in ("", "# nothing yet\n"):
        f = tmp_path / "empty.yaml"
        f.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_run_config([f])
        assert str(f) in str(e.value) and "empty" in str(e.value), str(e.value)
