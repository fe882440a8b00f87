"""Timeline PNG: one row per GPU stream (or CPU thread), kernels coloured by
class, forward/backward spans shaded."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from tptune.records.files import write_via_buffer  # noqa: E402
from tptune.trace.intervals import merged_segments  # noqa: E402
from tptune.trace.load import LoadedTrace, load_trace  # noqa: E402
from tptune.trace.metrics import attributed_events  # noqa: E402

CLASS_COLOURS = {
    "gemm": "#1f77b4",
    "comm": "#d62728",
    "other": "#2ca02c",
    "memcpy": "#9467bd",
    "memset": "#8c564b",
}
PHASE_COLOURS = {"forward": "#fff2b3", "backward": "#d9ecff"}


def plot_timeline(
    trace: str | Path | LoadedTrace,
    out_png: str | Path,
    step: int | None = None,
    patterns: Mapping[str, str] | None = None,
) -> Path:
    """Draw the trace (or one profiler step of it) to ``out_png``; returns the path."""
    loaded = load_trace(trace)
    ev = attributed_events(loaded, patterns)
    if step is not None:
        ev = ev.filter(pl.col("step") == step)
        if ev.height == 0:
            raise ValueError(f"{loaded.path}: no kernels in step {step}")
    t0 = ev["start"].min()
    # Drawing merged segments per row/class keeps huge traces drawable, and
    # merging within one class on one row hides nothing.
    seg = merged_segments(ev.filter(pl.col("unit").is_not_null()), ["unit", "cls"])
    units = sorted(seg["unit"].unique().to_list())
    row = {u: i for i, u in enumerate(units)}

    fig, ax = plt.subplots(figsize=(14, 1.2 + 0.45 * len(units)))
    spans = (
        ev.filter(pl.col("step").is_not_null() & pl.col("phase").is_not_null())
        .group_by("step", "phase")
        .agg(pl.col("start").min(), pl.col("end").max())
    )
    for s in spans.iter_rows(named=True):
        ax.axvspan((s["start"] - t0) / 1e6, (s["end"] - t0) / 1e6, color=PHASE_COLOURS.get(s["phase"], "#eee"), zorder=0)
        ax.text((s["start"] - t0) / 1e6, len(units) - 0.4, f"{s['phase'][:3]} {s['step']}", fontsize=7, va="bottom")
    for (unit, cls), g in seg.group_by("unit", "cls"):
        bars = list(zip(((g["start"] - t0) / 1e6).to_list(), ((g["end"] - g["start"]) / 1e6).to_list()))
        ax.broken_barh(bars, (row[unit] - 0.35, 0.7), facecolors=CLASS_COLOURS.get(cls, "#7f7f7f"), zorder=2)
    kind = "thread" if loaded.cpu_only else "stream"
    ax.set_yticks(range(len(units)), [f"{kind} {u}" for u in units])
    ax.set_ylim(-0.6, len(units) + 0.2)
    ax.set_xlabel("ms since first kernel")
    title = Path(loaded.path).name + (f" step {step}" if step is not None else "")
    ax.set_title(f"{title} (rank {loaded.rank})")
    handles = [Patch(color=c, label=k) for k, c in CLASS_COLOURS.items()]
    handles += [Patch(color=c, label=k) for k, c in PHASE_COLOURS.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 1.5 / (3 + len(units))),
              fontsize=7, ncol=len(handles), frameon=False)
    fig.tight_layout()
    out = Path(out_png)
    write_via_buffer(out, lambda f: fig.savefig(f, dpi=110, format=out.suffix[1:] or "png"))
    plt.close(fig)
    return out
