"""The default knob groups come from a stated rule over every committed knob run (search.knob_rule, issue 52):
the committed record (tptune/data/knob_groups.json) is what the rule derives from results/ today, the default
groups are read from it, and the rule's pieces are the ones it states (each knob session's kept / incumbent
rounds, pooled by stats.pooled, against the step margin)."""
import json
import re

import yaml

from conftest import ROOT
from tptune.search.knob_rule import EFFECT, committed, derive, group_blocks
from tptune.stats.pooled import pooled_ratio
from tptune.te.methods import ALL_GROUPS, PROVEN_GROUPS, knob_config

RESULTS = ROOT / "results"


def test_the_committed_record_is_the_rule_over_the_committed_runs():
    """No drift: re-run `python benchmarks/knob_evidence.py --write` when results/ gains a knob run."""
    assert derive(RESULTS) == committed()


def test_the_default_groups_are_the_records_and_the_effect_is_the_step_margin():
    rec = committed()
    assert list(PROVEN_GROUPS) == rec["default"] == knob_config()["groups"]
    assert rec["default"] == [g for g in ALL_GROUPS if rec["groups"][g]["default"]]
    for g, v in rec["groups"].items():   # in the default exactly when the pooled interval lies below 1 - effect
        assert v["default"] == (v["pooled"] is not None and v["pooled"]["hi"] < 1 - rec["effect"]), g
    text = (ROOT / "config" / "config.yaml").read_text()
    assert EFFECT == rec["effect"] == yaml.safe_load(text)["decision"]["step_margin"]
    # config/config.yaml's comment names the default it documents
    assert re.search(r"i\.e\. groups: \[([\w, ]+)\];", text)[1].split(", ") == rec["default"]


def test_a_larger_effect_leaves_out_a_group_whose_interval_no_longer_clears_it():
    rec = committed()
    num_sm = rec["groups"]["num_sm"]["pooled"]
    assert 1 - 2 * EFFECT < num_sm["hi"] < 1 - EFFECT        # clears 1%, not 2%
    assert "num_sm" not in derive(RESULTS, 2 * EFFECT)["default"]


def test_every_knob_session_is_one_block_pairing_the_kept_setting_with_its_incumbent():
    """Each group session of every finished knob search enters its group's pool once, and its ratio is the
    search's own kept / incumbent where both members were measured in the same rounds."""
    kept, same_rounds = {}, 0
    for f in RESULTS.glob("**/search/*/tp*/knobs/result.json"):
        r = json.loads(f.read_text())
        run = f.parents[4].relative_to(RESULTS).as_posix()
        for c in r.get("changes") or []:
            kept[f"{run}:{r['op']}:tp{r['tp']}:{c['session']}"] = c["kept_ratio"]
    pooled = {}
    for g, v in group_blocks(RESULTS).items():
        for name, a, b in v["blocks"]:
            assert name not in pooled and name.split(":")[3] == g
            p = pooled_ratio([(name, a, b)])
            pooled[name] = p.ratio
            if set(a) == set(b):
                same_rounds += 1
                assert abs(p.ratio - kept[name]) < 2e-5, name
    assert set(pooled) == set(kept) and same_rounds > 0.9 * len(kept)
