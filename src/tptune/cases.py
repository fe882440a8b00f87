"""Cases: one op at one TP size with one overlap setting. Their ids are readable and round-trip.

Case id  = "<op>-tp<N>-<variant>", also the folder cases/<op>/tp<N>/<variant>/ ;
           "layer-tp<N>-pack<T>.b<k>-<variant>": a whole block on packed THD input (Pack): bin <k>'s
           sequences (their lengths in the session's settings, layer.bins["<k>"]) packed into T tokens,
           padded to exactly T with one padding segment; its folder name is "pack<T>.b<k>-<variant>".
Variant  = none                       collectives on, no overlap (the reference)
         | nocomm                     same sharded GEMMs/norms, collectives removed (the bound)
         | chunked.n<N>               torch backend: GEMM split into N chunks, async collectives
         | ub.<preset>[+<gemm>.<method>[.<knob><int>]...]...
                                      TE userbuffers: a named ub_cfgs preset ("te" = TE's defaults),
                                      then per-GEMM overrides, e.g. ub.te+dgrad.bulk.sm8.cga2
Knobs: sm=num_sm cga=cga_size margin=set_sm_margin split=num_splits agg=aggregate ce=use_ce
atomic=atomic_gemm fbuf=fp8_buf rsfirst=pipeline_rs_overlap_first_gemm cprio=comm_priority
gprio=gemm_priority. CUDA stream priorities are <= 0 (lower is higher priority), so the priority
tokens carry the magnitude: cprio5 is comm_priority=-5.
"""
from __future__ import annotations

import hashlib
import numbers
import re
from dataclasses import dataclass, field

from tptune.errors import TptuneError
from tptune.model.ops import LAYER, OP_GEMMS, OPS

METHODS = {"ring": "ring_exchange", "bulk": "bulk", "pipe": "pipeline"}
METHOD_TOKENS = {v: k for k, v in METHODS.items()}
KNOBS = {"sm": "num_sm", "cga": "cga_size", "margin": "set_sm_margin", "split": "num_splits",
         "agg": "aggregate", "ce": "use_ce", "atomic": "atomic_gemm", "fbuf": "fp8_buf",
         "rsfirst": "pipeline_rs_overlap_first_gemm", "cprio": "comm_priority", "gprio": "gemm_priority"}
KNOB_TOKENS = {v: k for k, v in KNOBS.items()}
BOOL_KNOBS = {"set_sm_margin", "aggregate", "use_ce", "atomic_gemm", "fp8_buf",
              "pipeline_rs_overlap_first_gemm"}
PRIORITY_KNOBS = {"comm_priority", "gemm_priority"}   # CUDA stream priorities: <= 0, token = -value
KINDS = ("none", "nocomm", "chunked", "ub")
REFERENCE_KINDS = ("none", "nocomm")   # no overlap and the no-communication bound: what settings are judged against
MAX_DIR_NAME = 200   # bytes of a folder named after a variant id; file systems allow 255 (NAME_MAX)

_PRESET_RE = re.compile(r"^[a-z0-9_]+$")
_PACK_RE = re.compile(r"pack(\d+)\.b(\d+)")
_KNOB_RE = re.compile(r"^([a-z]+)(\d+)$")
# Snakemake wildcard constraints matching what format_variant() writes.
WILDCARD_CONSTRAINTS = {
    "op": "|".join(OPS),
    "tp": r"\d+",
    "variant": r"(none|nocomm|chunked\.n\d+|ub\.[a-z0-9_]+(\+[a-z]+(\.[a-z]+\d*)+)*)",
    "pack": _PACK_RE.pattern,
}


class CaseIdError(TptuneError, ValueError):
    """A case id that is not <op>-tp<N>-<variant> (a user's --case, a faults key): reported in one line."""


class PackError(TptuneError, ValueError):
    """A packed case's bin that cannot be its input (no lengths, a length not a positive integer, more
    tokens than the case's T)."""


@dataclass(frozen=True)
class Pack:
    """A layer case's packed THD input: the sequences of bin ``bin`` packed one after another into
    ``tokens`` tokens (T: userbuffers and the block are sized for T x 1), the rest one padding segment,
    attention causal within each sequence. A fill-to-capacity bin is T = the capacity; native batching's
    micro-batch of n real tokens is T = n (rounded up to a multiple of TP: sequence parallelism splits
    the T tokens over the ranks), its bin holding that micro-batch's lengths. The lengths are not part of
    the id: the session's settings carry them (layer.bins["<bin>"]), and every member's run.json records
    its own (settings.layer.bins, and ``pack``: real tokens, padding, segments)."""
    tokens: int
    bin: int

    @property
    def token(self) -> str:
        return f"pack{self.tokens}.b{self.bin}"

    @property
    def key(self) -> str:
        """The bin's key in layer.bins (JSON keys are strings)."""
        return str(self.bin)

    def segments(self, lengths) -> tuple[int, ...]:
        """The attention segments of the T tokens: the bin's sequence lengths in order, then the padding
        (T - their sum) as one more segment where there is any. PackError for a bin that cannot fill it."""
        if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
            raise PackError(f"{self.token}: bin {self.bin} must be a list of sequence lengths, got {lengths!r:.60}")
        seqs = list(lengths)
        if not seqs:
            raise PackError(f"{self.token}: bin {self.bin} holds no sequence")
        bad = [x for x in seqs if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1]
        if bad:
            raise PackError(f"{self.token}: bin {self.bin}'s sequence lengths must be positive integers, "
                            f"got {bad[0]!r}")
        seqs = [int(x) for x in seqs]
        real = sum(seqs)
        if real > self.tokens:
            raise PackError(f"{self.token}: bin {self.bin} holds {real} tokens, more than T = {self.tokens}")
        return tuple(seqs) + ((self.tokens - real,) if real < self.tokens else ())


def parse_pack(s: str) -> Pack:
    m = _PACK_RE.fullmatch(s)
    if not m:
        raise CaseIdError(f"bad pack part {s!r}: expected pack<T>.b<k> (T tokens, bin k)")
    return Pack(int(m.group(1)), int(m.group(2)))


@dataclass(frozen=True)
class GemmOverride:
    gemm: str                       # fprop | dgrad | wgrad
    method: str                     # ring_exchange | bulk | pipeline
    knobs: tuple[tuple[str, int], ...] = ()   # sorted (name, value), TE knob names

    def as_ub_cfg(self) -> dict:
        return {"method": self.method, **dict(self.knobs)}

    def token(self) -> str:
        parts = [self.gemm, METHOD_TOKENS[self.method]]
        parts += [f"{KNOB_TOKENS[k]}{-v if k in PRIORITY_KNOBS else v}" for k, v in self.knobs]
        return ".".join(parts)


@dataclass(frozen=True)
class Variant:
    kind: str                       # none | nocomm | chunked | ub
    chunks: int = 1                 # chunked
    preset: str = ""                # ub
    overrides: tuple[GemmOverride, ...] = field(default=())

    @property
    def overlapped(self) -> bool:
        return self.kind in ("chunked", "ub")


@dataclass(frozen=True)
class Case:
    op: str
    tp: int
    variant: Variant
    pack: Pack | None = None        # a layer case on packed THD input (None: one causal sequence a sample)

    @property
    def id(self) -> str:
        return f"{self.op}-tp{self.tp}-{self._pack_prefix}{format_variant(self.variant)}"

    @property
    def _pack_prefix(self) -> str:
        return f"{self.pack.token}-" if self.pack is not None else ""

    @property
    def variant_id(self) -> str:
        return format_variant(self.variant)

    @property
    def dir_name(self) -> str:
        """Folder name of this case in a session: its variant id, or where that is too long for a file
        name (a knob search's fully spelled-out setting can be), a short stable hash of it. Sessions
        record each member's folder in session.json (``runs``), so readers never rebuild the name."""
        v = self.variant_id
        p = self._pack_prefix
        if len((p + v).encode()) <= MAX_DIR_NAME:
            return p + v
        return f"{p}{v.split('+', 1)[0]}+h{hashlib.sha1(v.encode()).hexdigest()[:16]}"

    @property
    def dir(self) -> str:
        """Folder of this case below outputs/<run>/."""
        return f"cases/{self.op}/tp{self.tp}/{self.dir_name}"

    def with_variant(self, v: Variant) -> "Case":
        return Case(self.op, self.tp, v, self.pack)


def make_override(gemm: str, method: str, **knobs: int) -> GemmOverride:
    if method in METHODS:
        method = METHODS[method]
    if method not in METHOD_TOKENS:
        raise CaseIdError(f"unknown overlap method {method!r}: expected one of {', '.join(METHOD_TOKENS)}")
    if gemm not in ("fprop", "dgrad", "wgrad"):
        raise CaseIdError(f"unknown GEMM {gemm!r}: expected fprop, dgrad or wgrad")
    out = []
    for name, value in knobs.items():
        name = KNOBS.get(name, name)
        if name not in KNOB_TOKENS:
            raise CaseIdError(f"unknown TE knob {name!r}: expected one of {', '.join(KNOB_TOKENS)}")
        value = int(value)
        if name in PRIORITY_KNOBS:
            if value > 0:
                raise CaseIdError(f"knob {name}={value} out of range (CUDA stream priorities are <= 0)")
        elif value < 0 or (name in BOOL_KNOBS and value > 1):
            raise CaseIdError(f"knob {name}={value} out of range")
        out.append((name, value))
    return GemmOverride(gemm, method, tuple(sorted(out, key=lambda kv: list(KNOB_TOKENS).index(kv[0]))))


def format_variant(v: Variant) -> str:
    if v.kind in ("none", "nocomm"):
        return v.kind
    if v.kind == "chunked":
        return f"chunked.n{v.chunks}"
    if v.kind == "ub":
        ovs = sorted(v.overrides, key=lambda o: ("fprop", "dgrad", "wgrad").index(o.gemm))
        return "+".join([f"ub.{v.preset}"] + [o.token() for o in ovs])
    raise CaseIdError(f"unknown variant kind {v.kind!r}")


def parse_variant(s: str) -> Variant:
    if s in ("none", "nocomm"):
        return Variant(s)
    m = re.fullmatch(r"chunked\.n(\d+)", s)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise CaseIdError(f"variant {s!r}: chunk count must be >= 1")
        return Variant("chunked", chunks=n)
    if s.startswith("ub."):
        head, *rest = s.split("+")
        preset = head[3:]
        if not _PRESET_RE.match(preset):
            raise CaseIdError(f"variant {s!r}: preset name {preset!r} must match [a-z0-9_]+")
        ovs, seen = [], set()
        for tok in rest:
            gemm, method, *knobs = tok.split(".") + ([] if "." in tok else [""])
            if method not in METHODS:
                raise CaseIdError(f"variant {s!r}: {tok!r} needs <gemm>.<ring|bulk|pipe>[.<knob><int>]...")
            kv = {}
            for k in knobs:
                km = _KNOB_RE.match(k)
                if not km or km.group(1) not in KNOBS:
                    raise CaseIdError(f"variant {s!r}: bad knob {k!r} (expected one of "
                                      f"{', '.join(t + '<int>' for t in KNOBS)})")
                name = KNOBS[km.group(1)]
                kv[name] = -int(km.group(2)) if name in PRIORITY_KNOBS else int(km.group(2))
            if gemm in seen:
                raise CaseIdError(f"variant {s!r}: GEMM {gemm!r} overridden twice")
            seen.add(gemm)
            ovs.append(make_override(gemm, method, **kv))
        ovs.sort(key=lambda o: ("fprop", "dgrad", "wgrad").index(o.gemm))
        return Variant("ub", preset=preset, overrides=tuple(ovs))
    raise CaseIdError(f"unknown variant {s!r}: expected none, nocomm, chunked.n<N> or ub.<preset>[+...]")


def parse_case_id(case_id: str) -> Case:
    m = re.fullmatch(r"([a-z0-9]+)-tp(\d+)-(.+)", case_id)
    if not m:
        raise CaseIdError(f"bad case id {case_id!r}: expected <op>-tp<N>-<variant>")
    rest, pack = m.group(3), None
    if rest.startswith("pack"):   # no variant starts so; variants hold no "-"
        pack, _, rest = rest.partition("-")
        if not rest:
            raise CaseIdError(f"bad case id {case_id!r}: expected <op>-tp<N>-pack<T>.b<k>-<variant>")
    return make_case(m.group(1), int(m.group(2)), rest, pack)


def make_case(op: str, tp: int | str, variant: str | Variant, pack: str | Pack | None = None) -> Case:
    if op not in OPS and op != LAYER:
        raise CaseIdError(f"unknown op {op!r}: expected one of {', '.join(OPS)} (or {LAYER}, a whole block)")
    tp = int(tp)
    if tp < 1:
        raise CaseIdError(f"TP size must be >= 1, got {tp}")
    if isinstance(pack, str):
        pack = parse_pack(pack)
    if pack is not None:
        if op != LAYER:
            raise CaseIdError(f"{op}: only {LAYER} cases take packed input (pack<T>.b<k>)")
        if pack.tokens < 1 or pack.tokens % tp:
            raise CaseIdError(f"{pack.token}: T = {pack.tokens} tokens must be a positive multiple of TP = {tp} "
                              "(sequence parallelism splits them over the ranks)")
    v = parse_variant(variant) if isinstance(variant, str) else variant
    if op == LAYER and v.overrides:
        raise CaseIdError(f"{LAYER} cases take a whole ub_cfgs preset (ub.<name>), not per-GEMM overrides")
    for o in v.overrides:
        if o.gemm not in OP_GEMMS[op]:
            raise CaseIdError(f"op {op} has no overlappable {o.gemm} GEMM (has {', '.join(OP_GEMMS[op])})")
    return Case(op, tp, v, pack)
