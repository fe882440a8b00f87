"""Tables written to the run folder: Parquet, and beside it a CSV where people read the table too
(the run's measurements, the plan)."""
from __future__ import annotations

from pathlib import Path


def write_table(df, out: str | Path, csv: bool = False) -> None:
    """``df`` (a polars DataFrame) to ``out`` (Parquet); ``csv``: also to ``out`` with suffix .csv."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(out)
    if csv:
        df.write_csv(out.with_suffix(".csv"))
