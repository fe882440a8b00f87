"""The window calibration's files (cli.calibrate chooses the window): calibration/window.json and the
overlay window.yaml that sets timing.window_ms."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from tptune.records.files import write_text_atomic


def write_calibration(rec: dict, out_dir: Path) -> tuple[Path, Path | None]:
    """window.json (everything) and, when a window was chosen, window.yaml: the overlay to pass with
    --configfile after the run's own config."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / "window.json"
    write_text_atomic(js, json.dumps(rec, separators=(",", ":")))
    if rec["window_ms"] is None:
        return js, None
    overlay = out_dir / "window.yaml"
    write_text_atomic(overlay, f"# tptune calibrate-window on {rec.get('gpu') or rec['device']}: {rec['why']}.\n"
                       + yaml.safe_dump({"timing": {"window_ms": rec["window_ms"]}}, sort_keys=False))
    return js, overlay
