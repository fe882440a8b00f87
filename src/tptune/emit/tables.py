"""Tables written to the run folder: Parquet, and beside it a CSV where people read the table too
(the run's measurements, the plan); each whole or not at all (records.files)."""
from __future__ import annotations

from pathlib import Path

from tptune.records.files import write_text_atomic, write_via_buffer


def write_table(df, out: str | Path, csv: bool = False) -> None:
    """``df`` (a polars DataFrame) to ``out`` (Parquet); ``csv``: also to ``out`` with suffix .csv."""
    out = Path(out)
    write_via_buffer(out, df.write_parquet)
    if csv:
        write_text_atomic(out.with_suffix(".csv"), df.write_csv())
