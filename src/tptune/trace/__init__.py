"""Analysis of PyTorch profiler (Kineto) traces: load, classify kernels,
attribute them to steps/phases, overlap metrics, verdict, timeline."""

from tptune.trace.classify import DEFAULT_PATTERNS, classify
from tptune.trace.load import LoadedTrace, load_trace
from tptune.trace.metrics import COLUMNS, attributed_events, rank_metrics, summarize, trace_metrics
from tptune.trace.verdict import VerdictThresholds, overlap_verdict



def plot_timeline(trace, out_png, step=None, patterns=None):
    """See tptune.trace.timeline.plot_timeline (imported lazily: matplotlib is slow to import)."""
    from tptune.trace.timeline import plot_timeline as plot

    return plot(trace, out_png, step=step, patterns=patterns)


__all__ = [
    "COLUMNS",
    "DEFAULT_PATTERNS",
    "LoadedTrace",
    "VerdictThresholds",
    "attributed_events",
    "classify",
    "load_trace",
    "overlap_verdict",
    "plot_timeline",
    "rank_metrics",
    "summarize",
    "trace_metrics",
]
