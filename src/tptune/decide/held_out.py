"""The written file's block figures on rounds that did not choose it (issue 52): leave one round out.

The block session both chooses the file (decide.layer: the tuned combination, the finalists' combination
where it beats it, a reference that beats it, the fastest setting that passed where the tuned one failed)
and measures it against the references, in the same rounds. A figure read off the rounds that made the
choice is optimistic by the choice: on 4x H100 the Llama-3-70B defaults' file, `fastest_tp4`, read 0.976
against `nemo_tp4` on the rounds that chose it over the tuned combination, which read 0.982 on them.

Held out. For each round r of the session the file is chosen again, by the same rule, from the session
without round r; that choice's time in round r is paired with each reference's time in round r. A figure
is exp(mean) of those per-round log ratios with the paired 95% Student interval (stats.rounds), over the
rounds in which both were measured: every round is scored by a choice it took no part in. Where every
round's choice is the file written, the held-out figures are the session's own; where one is not, a figure
is that of the choosing rule, which is what the written file stands for: the rule chose it. Leave one out
rather than halves: a block session has 3 to 6 rounds, and a half of 2 rounds chooses with t(1) = 12.7 and
gives an interval as wide. The rounds scored share the choices made on the other rounds, so they are not
independent; the interval takes them as the session's own interval does.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from tptune.cases import parse_case_id
from tptune.records.measured_point import MeasuredPoint
from tptune.stats.rounds import log_ratio_interval, point_rounds
from tptune.stats.wording import classify_ratio

METRIC = "total_ms"


def without_round(point: MeasuredPoint, r: int) -> MeasuredPoint | None:
    """``point`` without its round ``r`` (the median over the rest); the point itself where it has no
    round r; None where r was its only round (the fold did not measure it)."""
    rounds = point_rounds(point)
    if r not in rounds:
        return point
    keep = [i for i in sorted(rounds) if i != r]
    if not keep:
        return None
    vals = [rounds[i] for i in keep]
    timing = dict(point.timing)
    timing[METRIC] = timing[METRIC].with_(rounds=tuple(vals), round_ids=tuple(keep),
                                          median=statistics.median(vals)).without("round_iters", "samples")
    return point.with_(timing=timing)


def held_out(points: dict[str, MeasuredPoint], written: str,
             choose: Callable[[dict[str, MeasuredPoint]], str | None], floor: float) -> dict | None:
    """The written file ``written`` against every other setting of the block session ``points``, each
    round scored by ``choose`` (the block's choice from a session's points) applied without that round
    (module doc): {"choices": {round: case}, "same": every choice is ``written``, "vs": {variant: ratio
    with its words}}; None where the session has fewer than two rounds."""
    ids = sorted({i for p in points.values() for i in point_rounds(p)})
    if len(ids) < 2:
        return None
    choices = {}
    for r in ids:
        fold = {c: q for c, q in ((c, without_round(p, r)) for c, p in points.items()) if q is not None}
        choices[r] = choose(fold)
    vs = {}
    for cid, ref in points.items():
        if cid == written:
            continue
        b = point_rounds(ref)
        ds = []
        for r in ids:
            a = point_rounds(points.get(choices[r])) if choices[r] is not None else {}
            if r in a and r in b and a[r] > 0 and b[r] > 0:
                ds.append(math.log(a[r]) - math.log(b[r]))
        ratio = log_ratio_interval(ds)
        if ratio is not None and ratio.rounds >= 2:
            d = ratio.to_dict()
            vs[parse_case_id(cid).variant_id] = {**d, "words": classify_ratio(d, floor)}
    return {"choices": {str(r): c for r, c in choices.items()}, "same": all(c == written for c in choices.values()),
            "vs": vs}
