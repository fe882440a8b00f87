"""Every figure the READMEs and docs quote, computed from the committed results (``tptune figures``).

``results/figures.yaml`` names each quoted figure once: what it is (a kind below), the session(s) it comes
from and its wording; a run folder's own ``figures.yaml`` holds the figures computed from that folder alone
(whichever file quotes them), in the same form (load_spec merges them; a name defined twice is an error). A Markdown file quotes it between markers, ``<!-- figure:NAME -->...<!-- /figure -->``
inline, or a whole block of text with ``{NAME}`` placeholders between ``<!-- figures:BLOCK -->`` and
``<!-- /figures:BLOCK -->``. A block names the file it lives in (``file:``, relative to the repository: the
README's headline figures, results/README.md's proven-results table) and its ``text:``; a block whose markers
are missing from its file is a difference too, so moving or deleting one cannot drop its figures unseen.
``tptune figures`` rewrites every marked copy; ``--check`` rewrites nothing and names every copy that differs
from what the results give.

Kinds (every ratio a / b, below 1 faster; docs/figures.md has the definitions):
  pooled   every block session of the same pair on the same workload and node kind
           (records.block_sessions.same_pair), pooled each session a block (stats.pooled); one session: its
           own paired interval. Where the pooled rounds include batches whose host never got ahead of the GPU
           the wording says so, always (the figure then holds host launch time, not GPU time alone).
  session  a / b over the rounds of one session only (e.g. "the best session alone").
  op       a / b over the rounds of one op session (``session: <run>/sessions/<op>/tp<N>[/<name>]``, e.g. a
           tuning run's TP point or a ``tptune verify`` op session); ``chosen`` names the op's pick (decisions.json ``ops.<op>.winner``).
           ``only:`` (a list of block sessions) restricts the pool to those sessions (e.g. "the first three
           runs alone").
  limit    a setting's block time over the block's own no-communication bound (medians; the bound without
           its burn-in round, stats.bound), or over setting ``b:``; ``burn_in: keep`` keeps the bound's first
           round (to quote the figure as first measured beside the corrected one).
  median   a setting's block (or op session's) median in ms (``ms``; the bound without its burn-in round unless ``burn_in: keep``).
  account  the block account of a block session's run and TP (report.block_account, as the report prints
           it): its fields (none_ms, written_ms, bound_ms, exposed_ms, ops_exposed_ms, hidden_shown, left_ms,
           in_ops_ms, block_only_ms, gain_ms = −block_only_ms, ops_share = ops_exposed_ms / written_ms),
           ``left[OP]`` (ms an op's pick leaves above its bound, all layers) and
           ``ref[VARIANT]`` (``limit``, ``shown``: a reference's time over the bound and the share it hides);
           ``decisions:`` names the run's decisions.json for a block session measured apart (a run's block2/):
           the ops' side (ops_exposed_ms, in_ops_ms, left[OP]) is the run's, the block's (none_ms, bound_ms,
           written_ms, exposed_ms, left_ms, block_only_ms) this session's medians, the bound without its
           burn-in round; references (ref) and hidden_shown stay the run's and are not quoted from it.
  hidden   the share of the block's exposed communication a setting hides (stats.efficiency, paired rounds,
           the bound without its burn-in round).
  efficiency  an Efficiency recorded in a JSON file (decisions.json meta.model_efficiency): as reports print it.
  host     setting ``a``'s host launch time against its GPU time in a block or op session (run.json
           host: host_ms, gpu_ms; ms its median), and the session's timed batches (batches) and those whose
           host never got ahead after every attempt (failed), every member's (stats.host_evidence), the
           host-ahead attempts they took (attempts; attempts_per_batch = attempts / batches); the setting's
           own: own_batches, own_failed.
  numerics the block numerics of ``files:`` (layer/tp<N>.json), setting ``a:`` or every setting: each
           tensor's error over no overlap's, its largest (output, input_grad, weight_grads), the smallest
           and largest over every tensor (min, max), the settings (settings) and those that passed (passed).
  run_cost where run ``run:``'s time went (records.run_cost; benchmarks/run_cost.py prints it): wall_s,
           member_rounds, held_s (what the members held), per_mr_s, window_per_mr_s (per member-round),
           op[OP][member_rounds|held_s|steps], sessions, steps|points|blocks (sessions of each kind) and
           steps_s|points_s|blocks_s (their seconds; sessions_s their sum), span_s, idle_s (inside the span, no session ran),
           outside_s (wall_s − span_s), gap_s (the median gap before a session on its GPUs), group_start_s
           (the worker-group starts inside sessions, their members' connect_s), no_search_s (what the run
           would spend at its own costs measuring no search step: its points and blocks, its group starts,
           outside_s and one gap_s before each point and block).
  verify_numerics  the numerics of ``tptune verify`` runs ``runs:`` (folders with verify.json, e.g. under
           numerics-calibration/; records.verify_numerics): legit_l2, legit_maxdiff (the largest rel. L2 and
           max |diff| ratio, error over no overlap's, any legitimate setting reached on any tensor, over the
           runs) and, of the first run, pair[SETTING][l2_ratio|max_ratio|worst|failed] (a mismatched pair's
           worst tensor by L2 ratio).
  spread   max / min − 1 (spread), min, max, median and n of field ``field`` (default ms) over the records of a
           JSON list (``file``, ``key`` as for value), e.g. a noise benchmark's calls: the spread from the
           recorded values, not from a rounded summary.
  calc     arithmetic over recorded values (report.figure_calc: sums, ratios, differences, aggregates and
           element-wise operations over lists, JSON-lines files), formatted as ``value``
  window   a benchmark calibration's recorded rounds cut by GPU time (report.figure_window: a member's level
           against a longer pre-roll, round-to-round spread, time bins, steps, round 0's first member)
  first_member  round 0's first member against the other members over the sessions of a list of runs
           (report.figure_window)
  burn_in  what leaving the bound's first round out changes over every committed point session with a bound
           (report.figure_bound: setting-rounds where the bound reads slower, bound faults, before and after)
  stopping_replay  what the futility stop saves, replayed over the committed sessions (report.figure_stopping)
  ops_hidden  the share of the exposed communication a run's chosen settings hide, the ops summed, from
           their TP-point sessions; ``burn_in: keep`` keeps the bound's first round (report.figure_bound)
  value    a number read from a file (wall_s.txt) or a JSON key (dotted; a list index as a number), with a
           Python format (a recorded dict, e.g. a ratio: "{value[ratio]:.3f} [{value[lo]:.3f}, ...]"); ``n``
           the length of a recorded list or dict (e.g. an op's ties).
Fields a ratio's wording can use: ratio lo hi rounds sessions over (" pooled over N sessions" or "") x x_lo
x_hi (b / a, "× faster") words (stats.wording) host (the host-behind note, "" when none).
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import yaml

from tptune.errors import TptuneError
from tptune.report.block_account import block_account
from tptune.report.figure_bound import burn_in_figure, ops_hidden_figure
from tptune.report.figure_calc import calc, walk_key
from tptune.report.figure_stopping import stopping_figure
from tptune.report.figure_window import first_member_figure, window_figure
from tptune.records.block_sessions import BlockSession, index, same_pair
from tptune.records.measured_point import MeasuredPoint
from tptune.records.point_fields import point_median
from tptune.records.run_cost import run_cost
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session
from tptune.records.verify_numerics import table as verify_numerics_table
from tptune.schedule.measured import read_sessions
from tptune.stats.bound import burned_in, is_bound
from tptune.stats.efficiency import Efficiency, op_efficiency
from tptune.stats.host_evidence import summary as host_summary
from tptune.stats.pooled import pooled_ratio
from tptune.stats.rounds import paired_ratio, point_rounds
from tptune.stats.wording import classify

SPEC = "figures.yaml"
MARGIN = 0.02
DEFAULT_RATIO = "{ratio} [{lo}, {hi}], {rounds} rounds{over}"
INLINE = re.compile(r"<!-- figure:([\w.-]+) -->(.*?)<!-- /figure -->", re.S)
BLOCK = re.compile(r"(<!-- figures:([\w.-]+) -->\n)(.*?)(<!-- /figures:\2 -->)", re.S)
MARKER = re.compile(r"<!-- (?:figure:(?P<open>[\w.-]+)|(?P<close>/figure)|figures:(?P<bopen>[\w.-]+)"
                    r"|/figures:(?P<bclose>[\w.-]+)) -->")


@dataclass
class Difference:
    file: str
    figure: str
    written: str
    computed: str
    missing: bool = False   # the file does not quote the block at all (its markers are gone)

    def __str__(self) -> str:
        if self.missing:
            return (f"{self.file}: {self.figure}: no <!-- {self.figure} --> ... <!-- /{self.figure} --> markers "
                    f"(results/{SPEC} places the block in this file)")
        old, new = self.written.splitlines() or [""], self.computed.splitlines() or [""]
        if len(old) > 1 or len(new) > 1:   # a block: its first line that differs
            i = next((i for i, (o, n) in enumerate(zip(old, new)) if o != n), min(len(old), len(new)))
            old, new = old[i:i + 1] or [""], new[i:i + 1] or [""]
            return f"{self.file}: {self.figure}, line {i + 1}: reads {old[0]!r}, the results give {new[0]!r}"
        return f"{self.file}: {self.figure}: reads {self.written!r}, the results give {self.computed!r}"


# kinds whose figure is a mapping of fields (their format names them; a calc value may read one)
FIELD_KINDS = {"window": window_figure, "first_member": first_member_figure, "burn_in": burn_in_figure,
               "stopping_replay": stopping_figure, "ops_hidden": ops_hidden_figure}

def _f3(x: float) -> str:
    return f"{x:.3f}"


def _case(bs: BlockSession, variant: str) -> str:
    tp = json.loads(bs.scope)["tp"]
    return variant if variant.startswith("layer-") else f"layer-tp{tp}-{variant}"


def _point(bs: BlockSession, case: str, keep_burn_in: bool = False) -> MeasuredPoint:
    p = bs.session.points.get(case)
    if p is None:
        raise TptuneError(f"{bs.rel}: no member {case} (it has {', '.join(sorted(bs.session.points))})")
    return burned_in(p) if is_bound(case) and not keep_burn_in else p


def load_spec(results: Path) -> dict:
    """results/figures.yaml merged with every run folder's own figures.yaml (results/<run>/figures.yaml: the
    figures computed from that folder alone, whichever file quotes them, paths still under results/); a name
    defined twice is an error naming both files."""
    files = [results / SPEC, *sorted(p for p in results.rglob(SPEC) if p.parent != results)]
    spec: dict = {"figures": {}, "blocks": {}}
    where: dict[tuple[str, str], Path] = {}
    for f in files:
        own = yaml.safe_load(f.read_text()) or {}
        if not isinstance(own, dict) or set(own) - {"figures", "blocks"}:
            raise TptuneError(f"{f}: expected a mapping with figures: and blocks: (results/{SPEC} says what each is)")
        for part in ("figures", "blocks"):
            for name, d in (own.get(part) or {}).items():
                if (part, name) in where:
                    raise TptuneError(f"{f}: {part[:-1]} {name!r} is defined in {where[part, name]} too: one "
                                      "definition each")
                where[part, name] = f
                spec[part][name] = d
    return spec


class Figures:
    """The figures of one results tree, computed on demand and kept."""

    def __init__(self, results: str | Path, spec: dict | None = None):
        self.results = Path(results)
        self.spec = spec if spec is not None else load_spec(self.results)
        self.defs = self.spec.get("figures") or {}
        self.blocks = self.spec.get("blocks") or {}
        self._index: list[BlockSession] | None = None
        self._done: dict[str, str] = {}

    @property
    def sessions(self) -> list[BlockSession]:
        if self._index is None:
            self._index = index(self.results)
        return self._index

    def _session(self, rel: str) -> BlockSession:
        bs = next((s for s in self.sessions if s.rel == rel), None)
        if bs is None:
            raise TptuneError(f"{SPEC}: no block session at results/{rel} (expected <run>/sessions/layer/tp<N>)")
        return bs

    def get(self, name: str) -> str:
        if name not in self._done:
            d = self.defs.get(name)
            if d is None:
                raise TptuneError(f"{SPEC}: no figure named {name!r}")
            try:
                self._done[name] = self._compute(d)
            except (KeyError, ValueError, OSError, TypeError) as e:
                raise TptuneError(f"{SPEC}: figure {name}: {e}") from e
        return self._done[name]

    def _compute(self, d: dict) -> str:
        kind = d["kind"]
        if kind in ("pooled", "session"):
            return self._ratio(d, pooled=kind == "pooled")
        if kind == "op":
            return self._ratio(d, pooled=False, op=True)
        if kind == "limit":
            bs = self._session(d["session"])
            b = _case(bs, d["b"]) if d.get("b") else next(c for c in bs.session.points if is_bound(c))
            keep = d.get("burn_in") == "keep"
            limit = point_median(_point(bs, _case(bs, d["a"]))) / point_median(_point(bs, b, keep))
            return d.get("format", "{limit}×").format(limit=_f3(limit))
        if kind == "median":
            if "/sessions/layer/" in d["session"]:
                bs = self._session(d["session"])
                case = _case(bs, d["a"])
            else:   # an op session
                bs, run, op = self._op_session(d["session"])
                case = self._op_case(run, op, d["session"].split("/sessions/")[1].split("/")[1], d["a"])
            ms = point_median(_point(bs, case, d.get("burn_in") == "keep"))
            return d.get("format", "{ms:.3f} ms").format(ms=ms)
        if kind == "account":
            return d["format"].format(**self._account(d["session"], d.get("decisions")))
        if kind == "hidden":
            bs = self._session(d["session"])
            tp = json.loads(bs.scope)["tp"]
            e = op_efficiency(_point(bs, f"layer-tp{tp}-none"), _point(bs, _case(bs, d["a"])),
                              _point(bs, f"layer-tp{tp}-nocomm"))
            return d.get("format", "{hidden}").format(hidden=e.shown())
        if kind == "efficiency":
            e = Efficiency.from_dict(_json_key(self.results / d["file"], d["key"]))
            return d.get("format", "{hidden}").format(hidden=e.shown())
        if kind == "host":
            return d["format"].format(**self._host(d["session"], d["a"]))
        if kind == "numerics":
            return d["format"].format(**self._numerics(d["files"], d.get("a")))
        if kind == "run_cost":
            return d["format"].format(**self._run_cost(d["run"]))
        if kind == "verify_numerics":
            return d["format"].format(**self._verify_numerics(d["runs"]))
        if kind == "spread":
            return d.get("format", "{spread:.1%}").format(**_spread(self.results / d["file"], d["key"], d.get("field", "ms")))
        if kind == "calc":
            v = calc(self.results, d, self._fields)
            return d.get("format", "{value}").format(value=v)
        if kind in FIELD_KINDS:
            return d.get("format", "{hidden}").format(**FIELD_KINDS[kind](self.results, d))
        if kind == "value":
            path = self.results / d["file"]
            v = _json_key(path, d["key"]) if d.get("key") else float(path.read_text().split()[0])
            return d.get("format", "{value}").format(value=v, n=len(v) if isinstance(v, (list, dict)) else None)
        raise ValueError(f"kind {kind!r} is none of pooled, session, op, limit, median, account, hidden, efficiency, "
                         "host, numerics, run_cost, verify_numerics, spread, value, calc, window, first_member, burn_in, ops_hidden, stopping_replay")

    def _fields(self, d: dict) -> dict:
        """The raw fields of a figure kind that computes them (a calc value naming a kind: figure_calc)."""
        if d["kind"] not in FIELD_KINDS:
            raise ValueError(f"a calc value's kind {d['kind']!r} is none of {', '.join(FIELD_KINDS)}")
        return FIELD_KINDS[d["kind"]](self.results, d)

    def _account(self, rel: str, decisions: str | None = None) -> dict:
        """The block account (report.block_account) of block session ``rel``'s run at its TP; ``decisions``
        (a decisions.json under results/) for a block session measured apart from the run that wrote its
        files (a run's block2/: the run's decisions, this session's block)."""
        own = self._session(rel)
        run, sep, _ = own.rel.partition("/sessions/layer/")
        if not sep:
            raise ValueError(f"{rel}: not a run's block session (<run>/sessions/layer/tp<N>)")
        tp = json.loads(own.scope)["tp"]
        mine = {int(json.loads(s.scope)["tp"]): s.session for s in self.sessions
                if s.rel.startswith(run + "/sessions/layer/")}
        dec = self.results / (decisions or f"{run}/decisions.json")
        acc = next((a for a in block_account(json.loads(dec.read_text()), mine)
                    if a["tp"] == int(tp)), None)
        if acc is None:
            raise ValueError(f"{run}: no block account at TP {tp} (report.block_account gives none)")
        if decisions:   # the ops' side is the run's; the block's medians are this session's (bound without burn-in)
            med = {v: point_median(_point(own, _case(own, v))) for v in ("none", "nocomm", acc["written"])}
            acc = {**acc, "none_ms": med["none"], "bound_ms": med["nocomm"], "written_ms": med[acc["written"]],
                   "exposed_ms": med["none"] - med["nocomm"], "left_ms": med[acc["written"]] - med["nocomm"],
                   "bound_measured": True}
            acc["block_only_ms"] = acc["left_ms"] - acc["in_ops_ms"]
        return {**acc, "left": {o["op"]: acc["num_layers"] * o["left_ms"] for o in acc["ops"]},
                "ref": {r["variant"]: r for r in acc["references"]}, "gain_ms": -acc["block_only_ms"],
                "ops_share": acc["ops_exposed_ms"] / acc["written_ms"]}

    def _member(self, rel: str, variant: str):
        """(the session, the member's case) of setting ``variant`` in block or op session ``rel``."""
        if "/sessions/layer/" in rel:
            bs = self._session(rel)
            return bs, _case(bs, variant)
        bs, run, op = self._op_session(rel)
        return bs, self._op_case(run, op, rel.split("/sessions/")[1].split("/")[1], variant)

    def _host(self, rel: str, variant: str) -> dict:
        """Setting ``variant``'s host launch time against its GPU time in session ``rel`` (run.json host), and
        the session's timed batches whose host never got ahead (stats.host_evidence), every member's."""
        bs, case = self._member(rel, variant)
        host = _point(bs, case).host or {}
        if host.get("host_ms") is None or host.get("gpu_ms") is None:
            raise ValueError(f"{rel}: {case} records no host launch time (host.host_ms, host.gpu_ms)")
        summaries = [host_summary(p) for p in bs.session.points.values()]
        own = host_summary(bs.session.points[case])
        batches, attempts = sum(x["batches"] for x in summaries), sum(x["attempts"] for x in summaries)
        return {"host_ms": host["host_ms"], "gpu_ms": host["gpu_ms"], "ms": point_median(_point(bs, case)),
                "own_failed": own["failed"], "own_batches": own["batches"],
                "batches": batches, "failed": sum(x["failed"] for x in summaries), "attempts": attempts,
                "attempts_per_batch": attempts / batches if batches else None}

    def _numerics(self, files: list[str], variant: str | None) -> dict:
        """The block numerics of ``files`` (layer/tp<N>.json): each tensor's error over no overlap's (l2_ratio)
        for setting ``variant`` (every setting without it): per tensor its largest, and the smallest and
        largest over every tensor; ``passed`` / ``settings`` the settings whose check passed."""
        ratios: dict[str, list[float]] = {}
        settings = passed = 0
        for rel in files:
            for st in json.loads((self.results / rel).read_text())["settings"]:
                if variant is not None and st.get("variant") != variant:
                    continue
                num = st.get("numerics") or {}
                if not num.get("summary"):
                    raise ValueError(f"{rel}: setting {st.get('variant')} has no numerics summary")
                settings += 1
                passed += bool(num.get("ok"))
                for tensor, v in num["summary"].items():
                    ratios.setdefault(tensor, []).append(v["l2_ratio"])
        if not settings:
            raise ValueError(f"{files}: no setting {variant!r} with numerics")
        every = [x for v in ratios.values() for x in v]
        return {**{t: max(v) for t, v in ratios.items()}, "min": min(every), "max": max(every),
                "settings": settings, "passed": passed}

    def _verify_numerics(self, runs: list[str]) -> dict:
        """The largest error ratios of the legitimate settings of verify runs ``runs`` (records.verify_numerics),
        and the first run's mismatched pairs."""
        rows = []
        for rel in runs:
            path = self.results / rel
            if not (path / "verify.json").is_file():
                raise ValueError(f"{rel}: no verify.json (runs: names tptune verify run folders under results/)")
            rows += [r for r in verify_numerics_table(path.parent) if r["run"] == path.name]
        l2 = [r["legit_max_l2"] for r in rows if r["legit_max_l2"] is not None]
        if not l2:
            raise ValueError(f"{runs}: no legitimate setting recorded its tensors' errors")
        return {"legit_l2": max(l2), "legit_maxdiff": max(r["legit_max_maxdiff"] for r in rows
                                                          if r["legit_max_maxdiff"] is not None),
                "pair": rows[0]["pairs"]}

    def _run_cost(self, run: str) -> dict:
        """Where run ``run``'s time went (records.run_cost, benchmarks/run_cost.py prints the same), flat."""
        res = run_cost(self.results / run)
        tl, total = res["timeline"], res["ops"].get("all")
        if tl is None or total is None:
            raise ValueError(f"{run}: no session timeline or no measured member (run_cost needs both)")
        k = tl["kinds"]
        fields = {"wall_s": res["wall_s"], "member_rounds": total["member_rounds"], "held_s": total["held_s"],
                  "per_mr_s": total["held_s"] / total["member_rounds"],
                  "window_per_mr_s": (total["window"] / total["member_rounds"]) if total["window"] is not None else None,
                  "op": {op: {**g, "steps": tl["steps_per_op"].get(op, 0)} for op, g in res["ops"].items()},
                  "sessions": sum(v["sessions"] for v in k.values()), "sessions_s": sum(v["s"] for v in k.values()),
                  **{kind: v["sessions"] for kind, v in k.items()}, **{f"{kind}_s": v["s"] for kind, v in k.items()},
                  "span_s": tl["span_s"], "idle_s": tl["idle_s"], "gap_s": tl["gap_s"],
                  "outside_s": res["wall_s"] - tl["span_s"] if res["wall_s"] is not None else None}
        starts = [x.start_s for x in read_sessions(RunDir(self.results / run)) if x.group_starts]
        fields["group_start_s"] = sum(starts) if None not in starts else None   # None: a start's seconds unrecorded
        parts = (k["points"]["s"], k["blocks"]["s"], fields["group_start_s"], fields["outside_s"], tl["gap_s"])
        fields["no_search_s"] = (None if None in parts else
                                 sum(parts[:4]) + (k["points"]["sessions"] + k["blocks"]["sessions"]) * tl["gap_s"])
        return fields

    def _op_session(self, rel: str) -> tuple[SimpleNamespace, str, str]:
        run, sep, rest = rel.partition("/sessions/")
        parts = rest.split("/")
        if not sep or len(parts) not in (2, 3) or not parts[1].startswith("tp"):
            raise ValueError(f"{rel}: not an op session (<run>/sessions/<op>/tp<N>[/<name>])")
        return SimpleNamespace(rel=rel, session=load_session(self.results / rel)), run, parts[0]

    def _op_case(self, run: str, op: str, tp: str, variant: str) -> str:
        if variant == "chosen":
            return _json_key(self.results / run / "decisions.json", f"ops.{op}.winner.case")
        return f"{op}-{tp}-{variant}"

    def _ratio(self, d: dict, pooled: bool, op: bool = False) -> str:
        if op:
            own, run, name = self._op_session(d["session"])
            tp = d["session"].split("/sessions/")[1].split("/")[1]
            a, b = self._op_case(run, name, tp, d["a"]), self._op_case(run, name, tp, d["b"])
        else:
            own = self._session(d["session"])
            a, b = _case(own, d["a"]), _case(own, d["b"])
        pairs = same_pair(self.sessions, own.rel, a, b) if pooled else [(own, a, b)]
        keep = d.get("burn_in") == "keep"   # the bound's first round kept: a figure as first measured
        if d.get("only"):
            only = set(d["only"])
            missing = only - {s.rel for s, _, _ in pairs}
            if missing:
                raise ValueError(f"only: {sorted(missing)} measured no {a} / {b} of the same pair")
            pairs = [x for x in pairs if x[0].rel in only]
        blocks = [(s.rel, point_rounds(_point(s, ca, keep)), point_rounds(_point(s, cb, keep))) for s, ca, cb in pairs]
        p = pooled_ratio(blocks) if pooled else None
        r = p if p is not None else paired_ratio(blocks[0][1], blocks[0][2])
        if r is None or r.lo is None:
            raise ValueError(f"{own.rel}: {a} / {b} has no interval (fewer than two paired rounds)")
        n = len(p.sessions) if p is not None else 1
        behind = batches = 0
        for s, ca, cb in pairs:
            for c in (ca, cb):
                h = host_summary(s.session.points[c])
                behind, batches = behind + h["failed"], batches + h["batches"]
        host = f"; includes host-behind rounds ({behind} of {batches} batches)" if behind else ""
        fields = {"ratio": _f3(r.ratio), "lo": _f3(r.lo), "hi": _f3(r.hi), "rounds": r.rounds, "sessions": n,
                  "over": f" pooled over {n} sessions" if n > 1 else "", "x": _f3(1 / r.ratio),
                  "x_lo": _f3(1 / r.hi), "x_hi": _f3(1 / r.lo), "words": classify(r.lo, r.hi, MARGIN),
                  "host": host}
        fmt = d.get("format", DEFAULT_RATIO)
        text = fmt.format(**fields)
        return text if "{host}" in fmt else text + host

    def block_file(self, name: str) -> str:
        """The file (relative to the repository) that quotes block ``name``."""
        return self._block(name)["file"]

    def _block(self, name: str) -> dict:
        b = self.blocks.get(name)
        if b is None:
            raise TptuneError(f"{SPEC}: no block named {name!r}")
        if not isinstance(b, dict) or not isinstance(b.get("file"), str) or not isinstance(b.get("text"), str):
            raise TptuneError(f"{SPEC}: block {name}: expected a mapping with file: (the Markdown file that quotes "
                              f"it, relative to the repository) and text: (its template), got {b!r:.80}")
        return b

    def render_block(self, name: str) -> str:
        return re.sub(r"\{([\w.-]+)\}", lambda m: self.get(m.group(1)), self._block(name)["text"])


def _json_key(path: Path, key: str):
    return walk_key(json.loads(path.read_text()), key, path.name)


def _spread(path: Path, key: str, field: str) -> dict:
    rows = _json_key(path, key)
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path.name}: {key} is no list of records (expected [{{{field!r}: ...}}, ...])")
    xs = [r[field] for r in rows]
    if min(xs) <= 0:
        raise ValueError(f"{path.name}: {key}: {field} must be positive for a spread, got {min(xs)}")
    return {"spread": max(xs) / min(xs) - 1, "min": min(xs), "max": max(xs), "median": statistics.median(xs),
            "n": len(xs)}


def quoting_files(root: Path) -> list[Path]:
    """The Markdown files whose figures are generated: README.md, results/**/README.md, docs/*.md."""
    files = [root / "README.md", *sorted((root / "results").rglob("README.md")), *sorted((root / "docs").glob("*.md"))]
    return [f for f in files if f.exists()]


def marker_problems(text: str, rel: str) -> list[str]:
    """Every figure marker of ``text`` (file ``rel``) that is not paired: an opening marker another marker or
    the file's end comes before its closing one (unclosed), a closing marker that closes nothing, a block's
    opening marker that does not end its line. A copy runs from its opening marker to its closing one, so
    rewriting past an unclosed marker would overwrite the text up to the next closing marker."""
    out, inline, block = [], None, None   # the pending openings: (line, marker)

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def unclosed(pending, by: str) -> None:
        closing = "<!-- /figure -->" if pending[1].startswith("<!-- figure:") else \
            pending[1].replace("<!-- figures:", "<!-- /figures:")
        out.append(f"{rel}:{pending[0]}: {pending[1]} is unclosed (no {closing} before {by})")

    for m in MARKER.finditer(text):
        at, here = line(m.start()), f"{rel}:{line(m.start())}"
        by = f"{m.group(0)} on line {at}"
        if m.group("open") or m.group("bopen"):
            if inline:
                unclosed(inline, by)
                inline = None
            if m.group("open"):
                inline = (at, m.group(0))
                continue
            if block:
                unclosed(block, by)
            if not text.startswith("\n", m.end()):
                out.append(f"{here}: {m.group(0)} must end its line (a block starts on the next one)")
            block = (at, m.group(0))
        elif m.group("close"):
            if inline:
                inline = None
            else:
                out.append(f"{here}: {m.group(0)} closes no <!-- figure:NAME --> (none is open before it)")
        else:
            if inline:
                unclosed(inline, by)
                inline = None
            if block and block[1] == f"<!-- figures:{m.group('bclose')} -->":
                block = None
            elif block:
                unclosed(block, by)
                block = None
            else:
                out.append(f"{here}: {m.group(0)} closes no <!-- figures:{m.group('bclose')} --> "
                           "(none is open before it)")
    for pending in (inline, block):
        if pending:
            unclosed(pending, "the end of the file")
    return out


def render(text: str, figs: Figures) -> tuple[str, list[tuple[str, str, str]]]:
    """(``text`` with every marked copy generated, [(figure or block, as written, as computed)] differing)."""
    diffs = []

    def block(m):
        new = figs.render_block(m.group(2))
        if not new.endswith("\n"):
            new += "\n"
        if new != m.group(3):
            diffs.append((f"figures:{m.group(2)}", m.group(3), new))
        return m.group(1) + new + m.group(4)

    def inline(m):
        new = figs.get(m.group(1))
        if new != m.group(2):
            diffs.append((m.group(1), m.group(2), new))
        return f"<!-- figure:{m.group(1)} -->{new}<!-- /figure -->"

    return INLINE.sub(inline, BLOCK.sub(block, text)), diffs


def generate(root: str | Path, check: bool = False, results: str | Path | None = None) -> list[Difference]:
    """Rewrite every marked copy under ``root`` (the repository) from ``results`` (default ``root/results``);
    with ``check`` write nothing. Returns the copies that differed (with check: that differ)."""
    root = Path(root)
    files = quoting_files(root)
    texts = {f: f.read_text() for f in files}
    bad = [p for f in files for p in marker_problems(texts[f], f.relative_to(root).as_posix())]
    if bad:   # the markers' pairing is what tells a copy from the text around it: write nothing
        raise TptuneError("figure markers out of place, nothing written:\n" + "\n".join(f"  {p}" for p in bad)
                          + "\n(close each marker or remove it, then run tptune figures again)")
    figs = Figures(Path(results) if results is not None else root / "results")
    out = []
    for f in files:
        text = texts[f]
        if "<!-- figure" not in text:
            continue
        new, diffs = render(text, figs)
        rel = f.relative_to(root).as_posix()
        out += [Difference(rel, name, old, comp) for name, old, comp in diffs]
        if diffs and not check:
            f.write_text(new)
    for name in figs.blocks:
        rel = figs.block_file(name)
        f = root / rel
        if f.exists() and f not in files:
            raise TptuneError(f"{SPEC}: block {name}: {rel} is none of the files tptune figures writes "
                              "(README.md, results/**/README.md, docs/*.md)")
        quoted = f.exists() and any(m.group(2) == name for m in BLOCK.finditer(f.read_text()))
        if not quoted:
            out.append(Difference(rel, f"figures:{name}", "", "", missing=True))
    return out
