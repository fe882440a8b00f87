import pytest

from tptune.te.methods import chunk_candidates, te_candidates


def summary(op, config=None):
    return {g: [(p.method, p.sm_candidates) for p in plans]
            for g, plans in te_candidates(op, 4, config).items()}


SMS = (1, 2, 4, 8, 16, 24, 32)


def test_defaults_ring_for_ag_rs_and_bulk_sm_search_for_column_backward():
    assert summary("qkv") == {"fprop": [("ring_exchange", ())], "dgrad": [("bulk", SMS)],
                              "wgrad": [("bulk", SMS)]}
    assert summary("fc2") == {"fprop": [("ring_exchange", ())], "dgrad": [("ring_exchange", ())]}


def test_pipeline_only_when_listed():
    assert summary("proj", {"pipeline": True})["fprop"] == [("ring_exchange", ()), ("pipeline", SMS)]
    assert summary("proj", {"te_methods": {"fprop": ["pipeline"]}})["fprop"] == [("pipeline", SMS)]
    # the column op's fprop all-gathers: no pipeline there even when asked
    assert summary("fc1", {"pipeline": True})["fprop"] == [("ring_exchange", ())]


def test_sm_list_is_sorted_and_checked():
    assert summary("fc1", {"num_sm": [8, 2, 4, 2]})["wgrad"] == [("bulk", (2, 4, 8))]
    with pytest.raises(ValueError, match="num_sm"):
        te_candidates("fc1", 4, {"num_sm": [0, 4]})
    with pytest.raises(ValueError, match="num_sm"):
        te_candidates("fc1", 4, {"num_sm": []})


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="te_methods.fprop"):
        te_candidates("qkv", 2, {"te_methods": {"fprop": ["bulk"]}})
    with pytest.raises(ValueError, match="te_methods.dgrad"):
        te_candidates("qkv", 2, {"te_methods": {"dgrad": ["magic"]}})
    with pytest.raises(ValueError, match="unknown key"):
        te_candidates("qkv", 2, {"num_sms": [1]})


def test_plans_build_case_ids():
    dgrad = te_candidates("qkv", 4, {"cga_size": 2})["dgrad"][0]
    cases = dgrad.cases()
    assert list(cases) == list(SMS)
    assert cases[8].id == "qkv-tp4-ub.te+dgrad.bulk.sm8.cga2"
    fprop = te_candidates("proj", 2)["fprop"][0]
    assert {k: c.id for k, c in fprop.cases("nemo_tp4").items()} == {None: "proj-tp2-ub.nemo_tp4+fprop.ring"}


def test_chunk_candidates():
    assert chunk_candidates() == [2, 4, 8]
    assert chunk_candidates({"chunks": [8, 2]}) == [2, 8]
    with pytest.raises(ValueError, match="chunks"):
        chunk_candidates({"chunks": [1, 2]})
