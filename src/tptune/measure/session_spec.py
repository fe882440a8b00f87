"""What one side-by-side session measures (launch.Launcher.session): its members on one model and TP,
the op settings they are measured with, and the rule that stops its rounds."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tptune.cases import REFERENCE_KINDS, Case
from tptune.model.spec import ModelConfig
from tptune.packing.rules import sample_bin


@dataclass(frozen=True)
class SessionSpec:
    """A session's members are measured in alternating rounds until every contender clears ``margin``
    against the leader, the round budget (op_settings["timing"]) is spent, or it could not clear what is
    left (search.rounds).

    op_settings: what the launcher takes of an op's settings: timing, check, layer, te and
    search.atomic_gemm (search.measurement.launcher_op_settings).
    contenders: the members that compete for the lead (None: every member).
    canary: a fixed reference measured once at the session's start (the drift canary).
    tie_margin: a resolved tie's margin where it differs from ``margin`` (a search step: rounds.Ratio.outcome).
    faults: case id -> an injected fault (tests of the failure paths).
    evidence: record each member's profiler traces and numerics check in its first round (the TP
    point's finalists need them; a search step's points do not).
    profile: with ``evidence``, the traces too (False: the numerics check alone; the packed block sessions,
    whose traces nothing reads).
    always: members measured in every round (with the references, no overlap and the bound), e.g. the
    layer stage's tuned block, which every other block is compared to.
    record: the measurement settings the session is measured with (search.measurement), kept in
    session.json as ``settings``.

    Packed layer members ("layer-tp<N>-pack<T>.b<k>-<variant>", cases.Pack) take their bin's sequence
    lengths from op_settings["layer"]["bins"]["<k>"] (each member is sent its own bin only); a member
    whose bin is missing or does not fit its T is refused here, before any worker starts."""

    session_id: str
    members: tuple[Case, ...]
    model: ModelConfig
    op_settings: dict
    contenders: tuple[str, ...] | None = None
    canary: Case | None = None
    margin: float = 0.01
    tie_margin: float | None = None
    faults: dict = field(default_factory=dict)
    evidence: bool = True
    profile: bool = True
    always: tuple[str, ...] | None = None
    record: dict | None = None

    def __post_init__(self):
        object.__setattr__(self, "members", tuple(self.members))
        for name in ("contenders", "always"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "faults", dict(self.faults or {}))
        bins = (self.op_settings.get("layer") or {}).get("bins") or {}
        for c in self.members:
            if c.pack is None:
                continue
            if c.pack.key not in bins:
                raise ValueError(f"session {self.session_id}: {c.id} needs bin {c.pack.bin} in layer.bins "
                                 f"(given: {sorted(bins) or 'none'})")
            c.pack.segments(bins[c.pack.key])   # PackError naming what does not fit

    @property
    def tp(self) -> int:
        """The one TP of the members and the canary (ValueError otherwise)."""
        tps = {c.tp for c in self.members} | ({self.canary.tp} if self.canary else set())
        if len(tps) != 1:
            raise ValueError(f"session {self.session_id}: members need one TP, got {sorted(tps)}")
        return tps.pop()

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.members]

    @property
    def references(self) -> set[str]:
        """The members every setting is judged against: no overlap and the bound."""
        return {c.id for c in self.members if c.variant.kind in REFERENCE_KINDS}

    @property
    def contender_ids(self) -> list[str]:
        """The contenders that are members (every member when none are named)."""
        ids = self.ids
        return [c for c in (self.contenders if self.contenders is not None else ids) if c in ids]

    @property
    def timing(self) -> dict:
        return self.op_settings["timing"]

    @property
    def round_bounds(self) -> tuple[int, int, int | None]:
        """(min rounds, max rounds, the budget futility judges against: None when timing.futility is off)."""
        timing = self.timing
        min_r, max_r = int(timing.get("min_rounds", 3)), int(timing.get("max_rounds", 8))
        return min_r, max_r, (max_r if timing.get("futility", True) else None)   # rounds.could_clear


def fill_bins(lengths, capacity: int, ids=(0,), seed: int = 0) -> dict[str, list[int]]:
    """layer.bins for packed members "layer-tp<N>-pack<T>.b<k>-<variant>": for each bin id k in ``ids`` a
    fill-to-capacity bin of the user's ``lengths`` at ``capacity`` (packing.rules.sample_bin: the bin that
    stands for a step's bins), each drawn with its own generator (seed, k), so the same ids give the same
    bins. A bin is its sequences: the same k at another T (at least their sum) pads the same sequences to
    that T instead."""
    return {str(k): [int(x) for x in sample_bin(lengths, capacity, np.random.default_rng([seed, int(k)]))]
            for k in ids}
