"""The run's own ub_cfgs presets (presets/<name>.yaml): the combinations the layer stage measures on the
block (decide.layer: tuned_tp<N>, fastest_tp<N>, tuned_other_dgrad_tp<N>), each under a comment header."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

from tptune.records.files import write_text_atomic


def write_preset(d: Path, name: str, ub_cfgs: dict, header: Iterable[str]) -> Path:
    path = d / f"{name}.yaml"
    head = "".join(f"# {n}\n" for n in header)
    write_text_atomic(path, head + yaml.safe_dump(ub_cfgs, sort_keys=False, default_flow_style=None))
    return path
