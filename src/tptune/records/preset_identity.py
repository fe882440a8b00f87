"""A preset file's settings as one string, so that two copies of the same settings compare equal: its entries
with YAML's true/false read as 1/0 (tptune writes 0/1, a copy ``tptune verify`` keeps may say false/true),
comments and key order aside."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml


def _ints(x):
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, dict):
        return {k: _ints(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_ints(v) for v in x]
    return x


def file_identity(path: Path) -> str:
    data = _ints(yaml.safe_load(Path(path).read_text()) or {})
    return "file:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
