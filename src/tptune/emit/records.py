"""The run's JSON records that a stage writes for the next (a search step, a TP point, a TP decision, a
layer record, ...): indented, written atomically."""
from __future__ import annotations

import json
from pathlib import Path

from tptune.records.files import write_text_atomic
from tptune.records.measured_point import MeasuredPoint


def _default(obj):
    return obj.to_dict() if isinstance(obj, MeasuredPoint) else str(obj)


def write_record(path: str | Path, obj) -> None:
    """``obj`` as indented JSON; a measured point in it as its record (MeasuredPoint.to_dict)."""
    write_text_atomic(path, json.dumps(obj, indent=1, default=_default))
