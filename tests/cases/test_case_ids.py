import re

import pytest

from tptune.cases import (WILDCARD_CONSTRAINTS, CaseIdError, Variant, format_variant, make_case, make_override, parse_case_id)

IDS = [
    "qkv-tp2-none", "proj-tp4-nocomm", "fc1-tp8-chunked.n4",
    "qkv-tp4-ub.te", "fc2-tp2-ub.nemo_tp4",
    "qkv-tp4-ub.te+fprop.ring.agg1.ce1+dgrad.bulk.sm8.cga2+wgrad.bulk.sm16.cga2.margin1",
    "proj-tp2-ub.te+fprop.pipe.sm24.cga2.margin1.split4",
]


@pytest.mark.parametrize("cid", IDS)
def test_round_trip(cid):
    c = parse_case_id(cid)
    assert c.id == cid
    assert parse_case_id(c.id) == c
    assert re.fullmatch(WILDCARD_CONSTRAINTS["variant"], c.variant_id)
    assert c.dir == f"cases/{c.op}/tp{c.tp}/{c.variant_id}"


def test_long_variant_ids_get_a_short_stable_folder_name():
    from tptune.cases import MAX_DIR_NAME

    big = 10 ** 60
    a = parse_case_id(f"qkv-tp2-ub.te+fprop.ring.sm{big}+dgrad.bulk.sm{big}.cga{big}+wgrad.bulk.sm{big}")
    b = parse_case_id(f"qkv-tp2-ub.te+fprop.ring.sm{big}+dgrad.bulk.sm{big}.cga{big}+wgrad.bulk.sm{big + 1}")
    assert len(a.variant_id.encode()) > 255
    assert len(a.dir_name) <= MAX_DIR_NAME and a.dir_name.startswith("ub.te+h")
    assert a.dir_name == parse_case_id(a.id).dir_name != b.dir_name
    assert a.dir == f"cases/qkv/tp2/{a.dir_name}"
    short = parse_case_id(IDS[5])
    assert short.dir_name == short.variant_id


def test_canonical_order():
    c = parse_case_id("qkv-tp2-ub.te+wgrad.bulk.cga2.sm4+dgrad.bulk.sm8")
    assert c.id == "qkv-tp2-ub.te+dgrad.bulk.sm8+wgrad.bulk.sm4.cga2"
    assert c.variant.overrides[1].as_ub_cfg() == {"method": "bulk", "num_sm": 4, "cga_size": 2}


@pytest.mark.parametrize("bad,match", [
    ("mlp-tp2-none", "unknown op"),
    ("qkv-2-none", "bad case id"),
    ("qkv-tp2-chunky", "unknown variant"),
    ("qkv-tp2-ub.te+dgrad.swap", "needs <gemm>"),
    ("qkv-tp2-ub.te+dgrad.bulk.foo3", "bad knob"),
    ("proj-tp2-ub.te+wgrad.bulk.sm4", "no overlappable wgrad"),
    ("qkv-tp2-ub.te+dgrad.bulk+dgrad.bulk.sm2", "overridden twice"),
    ("qkv-tp2-ub.TE", "preset name"),
    ("qkv-tp0-none", "TP size"),
])
def test_bad_ids(bad, match):
    with pytest.raises(CaseIdError, match=match):
        parse_case_id(bad)


def test_override_knob_ranges():
    with pytest.raises(CaseIdError, match="out of range"):
        make_override("dgrad", "bulk", set_sm_margin=2)
    v = Variant("ub", preset="te", overrides=(make_override("dgrad", "bulk", num_sm=8),))
    assert format_variant(v) == "ub.te+dgrad.bulk.sm8"
    assert make_case("fc1", 2, v).id == "fc1-tp2-ub.te+dgrad.bulk.sm8"


@pytest.mark.parametrize("cid", ["layer-tp2-pack8192.b0-none", "layer-tp4-pack16384.b12-nocomm",
                                 "layer-tp2-pack4096.b3-ub.nemo_tp4", "layer-tp2-pack64.b0-chunked.n2"])
def test_packed_layer_ids_round_trip(cid):
    """A layer case on packed THD input: pack<T>.b<k> between the TP and the variant (issue 53)."""
    c = parse_case_id(cid)
    assert c.id == cid and parse_case_id(c.id) == c
    assert re.fullmatch(WILDCARD_CONSTRAINTS["pack"], c.pack.token)
    assert c.dir_name == f"{c.pack.token}-{c.variant_id}" and c.dir == f"cases/layer/tp{c.tp}/{c.dir_name}"
    assert c.with_variant(parse_case_id("layer-tp2-none").variant).id == f"layer-tp{c.tp}-{c.pack.token}-none"
    assert c != parse_case_id(f"layer-tp{c.tp}-{c.variant_id}")   # never the unpacked block's point
    assert make_case("layer", c.tp, c.variant_id, c.pack.token) == c


def test_pack_segments_pad_to_t():
    pack = parse_case_id("layer-tp2-pack64.b0-none").pack
    assert pack.segments([20, 30]) == (20, 30, 14)          # the padding is a segment of its own
    assert pack.segments((40, 24)) == (40, 24)              # a full bin: no padding


@pytest.mark.parametrize("bad,match", [
    ("qkv-tp2-pack64.b0-none", "only layer cases"),
    ("layer-tp2-pack63.b0-none", "multiple of TP = 2"),
    ("layer-tp2-pack64-none", "bad pack part"),
    ("layer-tp2-pack64.b0", "pack<T>.b<k>-<variant>"),
    ("layer-tp2-pack64.b0-chunky", "unknown variant"),
])
def test_bad_packed_ids(bad, match):
    with pytest.raises(CaseIdError, match=match):
        parse_case_id(bad)
