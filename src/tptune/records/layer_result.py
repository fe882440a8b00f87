"""The layer stage's record of one TP (layer/tp<N>.json, decide.layer.layer_record) as a value: the
block session's tuned combination against each reference, and the block-level winner."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerResult:
    tp: int
    session: str                 # the block session's name ("layer/tp2")
    rounds: int
    stop: str                    # why the session stopped
    num_layers: int
    tuned: str                   # the tuned combination's case id
    built: tuple[str, ...]       # what each of the block's layers is
    winner: str | None           # None: no overlapped setting passed on the block
    reason: str
    numerics_failed: bool
    compared: bool               # the block compared the tuned combination with something
    settings: tuple[dict, ...]   # one row per measured case, as layer_record wrote it
    pooled: dict | None = None   # stats.pooled.block_pooled, set by decide.answer (decisions.json only)
    held_out: dict | None = None   # the file on rounds that did not choose it (decide.held_out); None: recorded before

    @classmethod
    def from_dict(cls, d: dict) -> LayerResult:
        return cls(tp=d["tp"], session=d["session"], rounds=d["rounds"], stop=d["stop"],
                   num_layers=d["num_layers"], tuned=d["tuned"], built=tuple(d["built"]), winner=d["winner"],
                   reason=d["reason"], numerics_failed=d["numerics_failed"], compared=d["compared"],
                   settings=tuple(d["settings"]), pooled=d.get("pooled"), held_out=d.get("held_out"))

    def to_dict(self) -> dict:
        """The record as layer/tp<N>.json holds it (``held_out`` where recorded), with ``pooled`` last where
        set (decisions.json meta["layer"])."""
        out = {"tp": self.tp, "session": self.session, "rounds": self.rounds, "stop": self.stop,
               "num_layers": self.num_layers, "tuned": self.tuned, "built": list(self.built),
               "winner": self.winner, "reason": self.reason, "numerics_failed": self.numerics_failed,
               "compared": self.compared, "settings": list(self.settings)}
        if self.held_out is not None:
            out["held_out"] = self.held_out
        if self.pooled is not None:
            out["pooled"] = self.pooled
        return out

    def row(self, case: str) -> dict | None:
        """The settings row of ``case`` (None where the block did not measure it)."""
        return next((r for r in self.settings if r["case"] == case), None)


def decided_layers(meta: dict) -> dict[str, LayerResult]:
    """decisions.json meta["layer"] as values: {str(tp): LayerResult}, {} where the run has no block."""
    return {t: LayerResult.from_dict(d) for t, d in (meta.get("layer") or {}).items()}
