"""Checkpoint layout: written to a temporary folder, completed by a marker written last, then renamed.

    <root>/step_00000020/
        COMPLETE            {"step": 20, ...}: written last; a folder without it is not a checkpoint
        coordinator.json    step, policy version, trained ids, data cursor, RNG, horizon stage, counters
        learner/            the learner's own files (DeepSpeed's format)

A crash at any point leaves either the previous complete checkpoints or a `*.partial-*` folder that
`latest_complete` ignores and the next save removes. Only the newest `keep_last` complete ones are kept.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CheckpointStore:
    def __init__(self, root: str | Path, keep_last: int = 2):
        self.root = Path(root)
        self.keep_last = keep_last

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if _STEP_DIR.match(p.name) and (p / MARKER).is_file()]
        return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))

    def path_of(self, step: int) -> Path:
        """Where the checkpoint of step `step` lives once complete."""
        return self.root / f"step_{step:08d}"

    def latest_complete(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def begin(self, step: int) -> Path:
        """A fresh temporary folder to write step `step` into (leftovers of crashed saves are removed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob("*.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(f"{self.path_of(step)}.partial-{os.getpid()}")
        tmp.mkdir()
        return tmp

    def commit(self, tmp: Path, step: int, info: dict | None = None) -> Path:
        """Write the marker last, rename into place, and prune old checkpoints."""
        write_json(tmp / MARKER, {"step": step, "time": time.time(), **(info or {})})
        final = self.path_of(step)
        if final.exists():  # the same step saved again (e.g. SIGTERM right after a periodic save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        for old in self.complete()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def resolve(self, resume: str) -> Path | None:
        """`` -> None; `auto` -> the latest complete checkpoint or None; a path -> that checkpoint (checked)."""
        if not resume:
            return None
        if resume == "auto":
            return self.latest_complete()
        path = Path(resume)
        if not (path / MARKER).is_file():
            raise FileNotFoundError(f"checkpoint.resume={resume!r} is not a complete checkpoint (no {MARKER})")
        return path
