"""One reader of ub_cfgs files for tptune check and tptune verify (issue 47 items 5 and 6): a file that is
not UTF-8 is one clear line, an empty file is TE's defaults for both, and tptune's own preset format (a
``base`` and an ``environment`` beside the GEMM entries, config/presets) is read as the ub_cfgs it
resolves to, never as GEMMs named base and environment."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from tptune.cli.verify import load_user_cfg
from tptune.te.check import load_ub_cfgs
from tptune.te.ubcfg import load_preset

TPTUNE = [sys.executable, "-m", "tptune"]


def _run(*args, cwd=ROOT):
    return subprocess.run([*TPTUNE, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "config/presets").glob("*.yaml")))
def test_check_reads_every_preset_tptune_ships(preset):
    """Before: nemo_tp4_recipe.yaml (base: nemo_tp4, an environment) had "2 conflicts", base and environment
    read as GEMMs."""
    p = _run("check", f"config/presets/{preset}", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout)
    assert res["ok"] and not res["problems"]


def test_a_preset_with_a_base_is_judged_as_what_it_resolves_to(tmp_path):
    """A user's copy of a preset naming a base: the entries over the base, as the workers load it; an entry TE
    refuses is still a conflict, named by its GEMM."""
    p = _run("check", "config/presets/nemo_tp4_recipe.yaml")
    assert p.returncode == 0 and "base" not in p.stdout.split("note:")[0], p.stdout
    assert "is a tptune preset (the format of config/presets): read as the ub_cfgs it resolves to, its entries " \
           "over preset nemo_tp4's, with NVTE_FWD_LAYERNORM_SM_MARGIN=20, NVTE_BWD_LAYERNORM_SM_MARGIN=20" in p.stdout
    assert load_ub_cfgs(ROOT / "config/presets/nemo_tp4_recipe.yaml") == load_preset("nemo_tp4_recipe")
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: nemo_tp4\nqkv_fprop: {method: bulk}\n")
    p = _run("check", str(mine))
    assert p.returncode == 2 and "qkv_fprop" in p.stderr and "Traceback" not in p.stderr, p.stdout + p.stderr


def test_a_file_that_is_not_utf8_is_one_line_for_check_and_verify(tmp_path):
    """Before: tptune verify --cfg printed a UnicodeDecodeError traceback."""
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"qkv_fprop: {method: ring_exchange}\n# caf\xe9\n")
    for args in (["check", str(bad)],
                 ["verify", "--model", "config/models/tiny.yaml", "--tp", "2", "--cfg", str(bad)]):
        p = _run(*args)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert f"{bad}:\n  - not UTF-8 text (byte 0xe9 at offset 40; expected a --tp-comm-overlap-cfg YAML" in p.stderr


def test_an_empty_file_is_te_defaults_for_check_and_verify(tmp_path):
    """Before: check took it as TE's defaults and verify refused it ("got NoneType")."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set: TE's defaults\n")
    p = _run("check", str(empty))
    assert p.returncode == 0 and p.stdout.startswith("ok:"), p.stdout + p.stderr
    assert load_user_cfg(empty) == {}
