"""tptune figures [--check]: every figure the READMEs and docs quote, generated from the committed results
(report.quoted_figures; results/figures.yaml names each one)."""
from __future__ import annotations

import sys
from pathlib import Path


def add_figures_parser(sub) -> None:
    p = sub.add_parser("figures", help="rewrite every figure README.md, results/**/README.md and docs/*.md quote "
                                       "(between <!-- figure:NAME --> markers) from the committed results "
                                       "(results/figures.yaml)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming every copy that differs")
    p.add_argument("--root", default=".", help="the repository (holds results/figures.yaml; default: here)")
    p.add_argument("--results", default=None, help="the results tree the figures come from (default: ROOT/results)")
    p.set_defaults(fn=cmd_figures)


def cmd_figures(a) -> int:
    from tptune.report.quoted_figures import generate
    diffs = generate(Path(a.root), check=a.check, results=a.results)
    for d in diffs:
        if d.missing:   # nothing to rewrite: where the block goes in its file is the author's choice
            print("missing: " + str(d), file=sys.stderr)
        else:
            print(("differs: " if a.check else "rewrote: ") + str(d), file=sys.stderr if a.check else sys.stdout)
    missing = [d for d in diffs if d.missing]
    if missing and not a.check:
        print(f"tptune figures: {len(missing)} block(s) missing from the file results/figures.yaml places them in; "
              "add their markers there", file=sys.stderr)
        return 1
    if a.check and diffs:
        print(f"tptune figures: {len(diffs)} quoted figure(s) differ from the results; `tptune figures` "
              "rewrites them", file=sys.stderr)
        return 1
    if not diffs:
        print("tptune figures: every quoted figure is the results'")
    return 0
