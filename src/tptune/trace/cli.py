"""``tptune analyze TRACE [TRACE...] [--json] [--plot FILE.png] [--patterns FILE.yaml]``"""

from __future__ import annotations

import argparse
import sys

import orjson
import polars as pl
import yaml

from tptune.errors import TraceError
from tptune.trace.load import load_trace
from tptune.trace.metrics import rank_metrics, summarize, COLUMNS, EXTRA_COLUMNS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tptune analyze", description="Overlap metrics of PyTorch profiler traces.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="Kineto trace .json/.json.gz, one per rank")
    p.add_argument("--json", action="store_true", help="print metrics and summary as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="timeline of the first trace")
    p.add_argument("--step", type=int, help="profiler step to plot (default: all)")
    p.add_argument("--patterns", metavar="FILE.yaml", help="kernel/phase regexes overriding the defaults")
    p.add_argument("--keep-last-step", action="store_true", help="never drop a truncated-looking last step")
    return p


def _patterns(path: str | None) -> dict | None:
    if path is None:
        return None
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise TraceError(f"{path}: cannot read patterns ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise TraceError(f"{path}: patterns must be a mapping of name to regex string")
    return doc


def analyze_cli(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        patterns = _patterns(args.patterns)
        frames, first = [], None
        for i, path in enumerate(args.traces):
            trace = load_trace(path)
            m = rank_metrics(trace, patterns, drop_truncated_last=not args.keep_last_step)
            frames.append(m.with_columns(rank=pl.lit(trace.rank if trace.rank is not None else i, dtype=pl.Int64)))
            first = first or (trace if args.plot else None)
            del trace
        df = pl.concat(frames, how="vertical_relaxed").select(*COLUMNS, *EXTRA_COLUMNS).sort("rank", "step", "phase")
        summary = summarize(df)
        if args.plot:
            from tptune.trace.timeline import plot_timeline

            plot_timeline(first, args.plot, step=args.step, patterns=patterns)
    except (TraceError, ValueError) as e:
        print(f"tptune analyze: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.buffer.write(
            orjson.dumps({"metrics": df.to_dicts(), "summary": summary.to_dicts()}, option=orjson.OPT_INDENT_2)
        )
        sys.stdout.write("\n")
    else:
        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, tbl_hide_dataframe_shape=True):
            print(df.select(*COLUMNS))
            print("summary (max/mean over ranks, median over steps):")
            print(summary.select("phase", "n_ranks", "n_steps", *[c for c in summary.columns if c.endswith("_max")]))
    return 0


def main() -> None:
    sys.exit(analyze_cli(sys.argv[1:]))


if __name__ == "__main__":
    main()
