"""The confirm stage's finished launches, kept one file each (``confirm/launches/r<round>-<setting>.json``), so a
cut stage resumes: a rerun runs only the launches it is missing.

A launch counts only for the stage it was run for: its ``key`` is a digest of everything that shapes a launch
(the Megatron arguments, every arm's flags and the contents of the overlap files they name, the entry, the
iterations). Records of another key are stale (the run's files or the stage's options changed since) and are
removed when the stage starts. Files are written atomically and opened without following links.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tptune.errors import ConfigError


def stage_key(parts: dict) -> str:
    """The digest of ``parts`` (JSON-able), with every existing file an argument anywhere in it names (an overlap
    cfg, the packed bins) hashed by content."""
    def args(x):
        if isinstance(x, str):
            yield x
        elif isinstance(x, dict):
            for v in x.values():
                yield from args(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from args(v)
    files = {a: hashlib.sha256(Path(a).read_bytes()).hexdigest() for a in sorted(set(args(parts)))
             if a.startswith("/") and Path(a).is_file()}
    blob = json.dumps({**parts, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class LaunchStore:
    def __init__(self, folder: Path, key: str):
        self.folder, self.key = Path(folder), key

    def path(self, round_: int, setting: str) -> Path:
        return self.folder / f"r{round_}-{setting}.json"

    def load(self, say=print) -> list[dict]:
        """The kept launches of this key, in (round, position) order; stale ones removed."""
        if not self.folder.is_dir():
            return []
        kept, stale = [], 0
        for p in sorted(self.folder.glob("r*-*.json")):
            if p.is_symlink() or not p.is_file():
                raise ConfigError(str(p), ["not a regular file: a confirm launch record must be one"])
            try:
                rec = json.loads(p.read_text())
            except ValueError:
                p.unlink()            # cut while written: the launch runs again
                continue
            if not isinstance(rec, dict) or rec.get("key") != self.key:
                p.unlink()
                stale += 1
                continue
            kept.append(rec)
        if stale:
            say(f"confirm: {stale} launch record(s) of an earlier stage with other settings removed")
        return sorted(kept, key=lambda x: (x["round"], x["position"]))

    def save(self, rec: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        p = self.path(rec["round"], rec["setting"])
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, p)
