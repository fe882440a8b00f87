"""The run's JSON records that a stage writes for the next (a search step, a TP point, a TP decision, a
layer record, ...): indented, written atomically."""
from __future__ import annotations

import json
from pathlib import Path

from tptune.records.files import write_text_atomic


def write_record(path: str | Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, default=str))
