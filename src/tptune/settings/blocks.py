"""The typed blocks of a resolved run config: timing, search, decision, layer, launcher, hardware,
parallel, and the per-op settings (timing + search + check) built once with each op's overrides.

Each block is frozen and remembers which keys the config gave, in the config's order: ``as_dict()``
gives back exactly those, for what records them (session.json, run.json, the measuring jobs' params),
so a block read from a run recorded before a key existed records what it recorded then. A field the
config left out holds the default every reader used for it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields

from tptune.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class _Block:
    given: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict | None):
        d = d or {}
        names = {f.name for f in fields(cls)} - {"given"}
        return cls(**{k: copy.deepcopy(v) for k, v in d.items() if k in names}, given=tuple(d))

    def as_dict(self) -> dict:
        """The block as the config gave it (given keys only, in its order)."""
        return {k: copy.deepcopy(getattr(self, k)) for k in self.given}

    def given_or_none(self, *keys: str) -> dict:
        """``keys`` with their values, None where the config gave none."""
        return {k: copy.deepcopy(getattr(self, k)) if k in self.given else None for k in keys}


def rounds_problem(where: str, lo, hi) -> str | None:
    if lo is not None and hi is not None and lo > hi:
        return (f"field '{where}.min_rounds' = {lo} exceeds max_rounds = {hi}: a session stops at max_rounds "
                f"(its round budget), so min_rounds must be at most max_rounds")
    return None


def margins_problem(step_margin, noise_floor) -> str | None:
    if step_margin is not None and noise_floor is not None and step_margin > noise_floor:
        return (f"field 'decision.step_margin' = {step_margin} exceeds decision.noise_floor = {noise_floor}: a "
                f"search step wins beyond step_margin and ties within noise_floor, so step_margin must be at most "
                f"noise_floor")
    return None


@dataclass(frozen=True, kw_only=True)
class Timing(_Block):
    """How a session times its members (worker.timing reads the same keys from as_dict())."""
    warmup: int | None = None
    iters: int | None = None
    min_rounds: int | None = None
    max_rounds: int | None = None
    futility: bool = True
    mode: str | None = None
    preroll_ms: float | None = None
    window_ms: float | str | None = None     # ms, or "auto": the node's calibrated window
    lead_in: bool = False
    profile_steps: int | None = None

    def __post_init__(self):
        why = rounds_problem("timing", self.min_rounds, self.max_rounds)
        if why:
            raise ConfigError("timing", [why])

    @property
    def window_auto(self) -> bool:
        return self.window_ms == "auto"


@dataclass(frozen=True, kw_only=True)
class Search(_Block):
    """What the search tries for an op (search.mode, the candidates, the references)."""
    mode: str = "bisect"
    knobs: dict | None = None
    chunks: list[int] | None = None
    num_sm: list[int] | None = None
    te_presets: list[str] = field(default_factory=list)
    pipeline: bool = False
    atomic_gemm: bool = False
    runner_up: bool = False
    te_methods: dict | None = None
    cga_size: int | None = None
    set_sm_margin: int | None = None

    def given_of(self, keys) -> dict:
        """The given ones of ``keys`` (the method planner's search settings)."""
        return {k: copy.deepcopy(getattr(self, k)) for k in keys if k in self.given}


@dataclass(frozen=True, kw_only=True)
class Decision(_Block):
    noise_floor: float | None = None
    step_margin: float | None = None
    tp_tolerance: float | None = None
    explore_all_tps: bool = False
    trust_verdict: bool = False
    min_hidden_fraction: float | None = None
    min_tp: int | None = None

    def __post_init__(self):
        why = margins_problem(self.step_margin, self.noise_floor)
        if why:
            raise ConfigError("decision", [why])

    @property
    def step_margins(self) -> tuple[float, float]:
        """(win, tie) margins of a search step's paired comparison: a value wins beyond
        decision.step_margin, a resolved tie lies within decision.noise_floor. A run recorded without
        step_margin (before it existed) replays with the noise floor for both, as it was measured."""
        win = self.noise_floor if self.step_margin is None else self.step_margin
        return float(win), float(self.noise_floor)


@dataclass(frozen=True, kw_only=True)
class Layer(_Block):
    """The layer stage: the per-op choices proven on a block of ``num_layers`` transformer layers."""
    enabled: bool = True
    num_layers: int = 2
    bound: bool = True      # te: the block's own no-communication bound (nocomm) measured beside the settings

    def block_settings(self) -> dict:
        """What a block session is measured with (all but ``enabled``)."""
        return {k: v for k, v in self.as_dict().items() if k != "enabled"}


@dataclass(frozen=True, kw_only=True)
class Confirm(_Block):
    """The confirm stage (tptune.confirm): the answer in Megatron-LM's own training loop, after decide."""
    enabled: bool = False
    rounds: int = 3
    max_layers: int = 4
    iters: int = 20
    micro_batches: int = 4
    timeout_s: float = 300.0
    max_rounds: int = 12
    budget_s: float = 300.0
    target_half_width: float = 0.005
    megatron_lm: str | None = None


@dataclass(frozen=True, kw_only=True)
class LauncherSettings(_Block):
    pool_dir: str | None = None
    case_timeout_s: float | None = None
    startup_timeout_s: float | None = None
    idle_timeout_s: float | None = None
    keep_idle_groups: bool = True
    retries: int = 0
    multicast: bool = False
    cpu_slots: int = 8
    cpu_threads_per_rank: int = 1
    env: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Hardware(_Block):
    """For the analytic plan and the memory check (model.plan.Hardware takes as_dict())."""
    gpu_memory_gb: float | None = None
    gpu: str | None = None
    peak_tflops_fp8: float | None = None
    peak_tflops: float | None = None
    gemm_efficiency: float | None = None
    bus_gbps: float | None = None
    latency_us: float | None = None


@dataclass(frozen=True, kw_only=True)
class Parallel(_Block):
    """The training layout the memory check assumes (model.memory fills the defaults from as_dict())."""
    dp: int | str | None = None
    pp: int | None = None
    distributed_optimizer: bool | None = None
    recompute: str | None = None
    memory_fraction: float | None = None
    memory_check: bool | None = None
    ep: int | None = None
    etp: int | None = None


@dataclass(frozen=True)
class OpSettings:
    """One op's timing, search and check: the run's values with the op's own overrides merged over."""
    timing: Timing
    search: Search
    check: bool

    def as_dict(self) -> dict:
        """What the launcher takes for the op (Launcher.session's op settings)."""
        return {"timing": self.timing.as_dict(), "search": self.search.as_dict(), "check": self.check}
