"""The run folder's address book: every place inside outputs/<run> has one name here, used by the package
and the Snakemake rules alike (docs/architecture.md draws the layout).

Arguments may be wildcard patterns as well as values: ``RunDir("outputs/x").tp_point("{op}", "{tp}")`` is
the rule pattern outputs/x/search/{op}/tp{tp}/point.json."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SESSION_JSON = "session.json"
PARTIAL_JSON = "session.partial.json"   # an unfinished session's completed rounds (measure.launch)
RUN_JSON = "run.json"


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def of_run(cls, name: str) -> RunDir:
        """The folder the workflow gives the run called ``name`` (config "run"): outputs/<name>."""
        return cls(Path("outputs") / name)

    def __str__(self) -> str:
        return str(self.root)

    # what the run started from and what it planned
    @property
    def config_json(self) -> Path:
        return self.root / "config.json"

    @property
    def run_lock(self) -> Path:
        """Held by the snakemake that drives the run (records.run_lock)."""
        return self.root / ".run.lock"

    @property
    def calibration_json(self) -> Path:
        """The node's window calibration (timing.window_ms: auto)."""
        return self.calibration_dir / "window.json"

    @property
    def calibration_dir(self) -> Path:
        return self.root / "calibration"

    @property
    def progress_jsonl(self) -> Path:
        """One JSON line per invocation start and per finished session (records.progress)."""
        return self.root / "progress.jsonl"

    @property
    def wall_predicted_json(self) -> Path:
        """The run's predicted wall time on this node, written before measuring."""
        return self.root / "wall_predicted.json"

    @property
    def wall_s_txt(self) -> Path:
        """The run's measured wall seconds, written by whoever timed the snakemake (scripts/device_workflow.sh)."""
        return self.root / "wall_s.txt"

    @property
    def wall_8gpu_predicted_txt(self) -> Path:
        """The wall seconds the run's sessions would take on an 8-GPU node (TP 2, 4, 8), replayed."""
        return self.root / "wall_s.8gpu-predicted.txt"

    @property
    def model_json(self) -> Path:
        return self.root / "model.json"

    @property
    def plan_parquet(self) -> Path:
        return self.root / "plan.parquet"

    @property
    def plan_csv(self) -> Path:
        return self.root / "plan.csv"

    # sessions/<op>/tp<N>/<dim>/step<k>, sessions/<op>/tp<N>/point, sessions/layer/tp<N>,
    # sessions/layer/tp<N>/pack<T>
    @property
    def sessions(self) -> Path:
        return self.root / "sessions"

    def step_session(self, op: str, tp, dim: str, step) -> Path:
        """A session's folder: its members' folders and session.json."""
        return self.sessions / step_session_name(op, tp, dim, step)

    def point_session(self, op: str, tp) -> Path:
        return self.sessions / point_session_name(op, tp)

    def layer_session(self, tp) -> Path:
        return self.sessions / layer_session_name(tp)

    def packed_session(self, tp, capacity) -> Path:
        """The packed block session at capacity T (issue 53, docs/packing.md): beside the layer session's members."""
        return self.sessions / packed_session_name(tp, capacity)

    def session_name(self, session_dir: str | Path) -> str:
        """A session folder's name relative to sessions/ ("qkv/tp2/point", "layer/tp2")."""
        return str(Path(session_dir).resolve().relative_to(self.sessions.resolve()))

    def session_jsons(self) -> list[Path]:
        """Every recorded session's session.json, in path order."""
        return sorted(self.sessions.glob(f"**/{SESSION_JSON}"))

    def point_run_jsons(self) -> list[Path]:
        """Every TP-point member's run.json, in path order."""
        return sorted(self.sessions.glob(f"*/tp*/point/*/{RUN_JSON}"))

    # search/<op>/tp<N>/...: the search records, the TP points and decisions
    @property
    def search(self) -> Path:
        return self.root / "search"

    def tp_search(self, op: str, tp) -> Path:
        return self.search / op / f"tp{tp}"

    def search_step(self, op: str, tp, dim: str, step) -> Path:
        return self.tp_search(op, tp) / dim / f"step{step}.json"

    def search_result(self, op: str, tp, dim: str) -> Path:
        return self.tp_search(op, tp) / dim / "result.json"

    def tp_results(self, op: str, tp) -> Path:
        return self.tp_search(op, tp) / "results.json"

    def tp_point(self, op: str, tp) -> Path:
        return self.tp_search(op, tp) / "point.json"

    def tp_decision(self, op: str, tp) -> Path:
        return self.tp_search(op, tp) / "decision.json"

    def op_final(self, op: str) -> Path:
        return self.search / op / "final.json"

    @property
    def searches_done(self) -> Path:
        return self.search / "done.json"

    def searched_tps(self, op: str) -> list[int]:
        """The TP sizes with a search folder of ``op``, smallest first."""
        return sorted(int(d.name[2:]) for d in self.search.joinpath(op).glob("tp*"))

    # analysis/: per-session trace tables, mirroring sessions/
    @property
    def analysis(self) -> Path:
        return self.root / "analysis"

    def session_analysis(self, session_dir: str | Path) -> Path:
        """analysis/<op>/tp<N>/<name>.parquet of the session in ``session_dir``."""
        rel = Path(self.session_name(session_dir))
        return self.analysis / rel.parent / f"{rel.name}.parquet"

    def step_analysis(self, op: str, tp, dim: str, step) -> Path:
        return self.analysis / op / f"tp{tp}" / dim / f"step{step}.parquet"

    def point_analysis(self, op: str, tp) -> Path:
        return self.analysis / op / f"tp{tp}" / "point.parquet"

    # layer/: the block stage's records and the presets it measured
    def layer_json(self, tp) -> Path:
        return self.root / "layer" / f"tp{tp}.json"

    def layer_jsons(self) -> list[Path]:
        return sorted((self.root / "layer").glob("tp*.json"))

    @property
    def presets(self) -> Path:
        """The run's own ub_cfgs presets (the block's tuned combinations)."""
        return self.root / "presets"

    def preset_yaml(self, name: str) -> Path:
        return self.presets / f"{name}.yaml"

    # packing/: packed micro-batches (workload.packing, docs/packing.md)
    @property
    def packing_plan_json(self) -> Path:
        """What the packed sessions measure: the TP, the capacities T, the settings (tptune packing-plan)."""
        return self.packing_dir / "plan.json"

    @property
    def packing_json(self) -> Path:
        """The packing decision: overlap on or off at which T (tptune packing-decide)."""
        return self.root / "packing.json"

    @property
    def packing_dir(self) -> Path:
        """The packing plan and each framework's settings at the chosen T (packing.emit), as users load them."""
        return self.root / "packing"

    @property
    def pooled_with_json(self) -> Path:
        """Sessions elsewhere that measured the block's pair (stats.pooled), when the run has them."""
        return self.root / "pooled_with.json"

    # what the run derived and wrote for users
    @property
    def measurements_parquet(self) -> Path:
        return self.root / "measurements.parquet"

    @property
    def measurements_csv(self) -> Path:
        return self.root / "measurements.csv"

    @property
    def decisions_json(self) -> Path:
        return self.root / "decisions.json"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def confirm_json(self) -> Path:
        """The confirm stage's record: the set, the best preset and no overlap in Megatron-LM's training loop."""
        return self.root / "confirm.json"

    @property
    def confirm_dir(self) -> Path:
        """The confirm stage's files: each launch's log (logs/), the preset's Megatron yaml it wrote."""
        return self.root / "confirm"

    @property
    def status_json(self) -> Path:
        return self.root / "status.json"

    def wall_predicted_txt(self, gpus: int) -> Path:
        """The wall seconds the run's sessions would take on a node of ``gpus`` GPUs, replayed (tptune predict)."""
        return self.root / f"wall_s.{int(gpus)}gpu-predicted.txt"

    @property
    def figures(self) -> Path:
        return self.root / "figures"

    @property
    def summary_png(self) -> Path:
        return self.figures / "summary.png"

    def timeline_png(self, case_id: str) -> Path:
        return self.figures / f"timeline-{case_id}.png"

    def file(self, name: str) -> Path:
        """A file users load, by its name (decide.file_sets names them: tp_comm_overlap_cfg.tp2.yaml, ...)."""
        return self.root / name

    def files(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern))

    def log(self, job: str, name: str | None = None) -> Path:
        """logs/<job>.log, or logs/<job>/<name>.log for a job run per wildcard."""
        return self.root / "logs" / (f"{job}.log" if name is None else f"{job}/{name}.log")


# A session's name is its folder relative to sessions/ (records.sessions.Session.name, the "session" column
# of measurements.parquet).
def step_session_name(op: str, tp, dim: str, step) -> str:
    return f"{op}/tp{tp}/{dim}/step{step}"


def point_session_name(op: str, tp) -> str:
    return f"{op}/tp{tp}/point"


def layer_session_name(tp) -> str:
    return f"layer/tp{tp}"


def packed_session_name(tp, capacity) -> str:
    return f"layer/tp{tp}/pack{capacity}"


def is_packed_session(name: str) -> bool:
    """A packed block session's name (layer/tp<N>/pack<T>): measured after the run's decisions, which never read it."""
    parts = name.split("/")
    return len(parts) == 3 and parts[0] == "layer" and parts[2].startswith("pack")
