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
    p.set_defaults(fn=cmd_figures)


def cmd_figures(a) -> int:
    from tptune.report.quoted_figures import generate
    diffs = generate(Path(a.root), check=a.check)
    for d in diffs:
        print(("differs: " if a.check else "rewrote: ") + str(d), file=sys.stderr if a.check else sys.stdout)
    if a.check and diffs:
        print(f"tptune figures: {len(diffs)} quoted figure(s) differ from the results; `tptune figures` "
              "rewrites them", file=sys.stderr)
        return 1
    if not diffs:
        print("tptune figures: every quoted figure is the results'")
    return 0
