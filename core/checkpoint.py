"""Checkpoint layout: written to a temporary folder, made durable, completed by a marker written last, renamed.

    <root>/step_00000020/
        COMPLETE            {"step": 20, ..., "files": {relative path: [size, sha256]}}: written last
        coordinator.json    step, policy version, trained ids, data cursor, RNG, horizon stage, counters
        learner/            the learner's own files (DeepSpeed's format)
        policy/             the policy as a Hugging Face folder

What must hold:
- A folder is a checkpoint only with its marker, and the marker is written only after every file in the folder
  (tensors included) and the folder itself were fsynced; the marker lists each file with its size and SHA-256.
- `resolve("auto")` takes the newest checkpoint that verifies against its marker's manifest; one that does not
  (a file cut short, changed or missing) is skipped with a warning for the one before it.
- A complete checkpoint is never deleted before its replacement is complete: re-saving a step first renames the
  old folder aside (`.replaced-<pid>`, still found as a checkpoint of that step) and removes it only after the
  new one is in place; pruning renames a folder out of the checkpoint names before deleting it, so a
  half-deleted folder is never taken for a checkpoint.
- A crash at any point leaves the previous complete checkpoints, plus `*.partial-*` / `*.pruning-*` leftovers
  that are ignored and removed by the next save.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("agentgym.checkpoint")

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d{8})(\.replaced-\d+)?$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_durably(path: Path, text: str) -> None:
    """Write through a temporary file, fsync and rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_text_durably(path, json.dumps(data, indent=1, sort_keys=True))


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def seal(folder: Path) -> dict[str, list]:
    """fsync every file and folder under `folder` (deepest first) and return its manifest."""
    manifest: dict[str, list] = {}
    for dirpath, _, files in os.walk(folder, topdown=False):
        for name in files:
            path = Path(dirpath) / name
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            manifest[str(path.relative_to(folder))] = [path.stat().st_size, _digest(path)]
        _fsync_dir(Path(dirpath))
    return manifest


def verify(folder: Path) -> str:
    """"" when `folder` matches its marker's manifest; else what does not (a marker without a manifest, written
    before manifests existed, is taken as it is)."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError) as exc:
        return f"its {MARKER} marker is unreadable ({exc})"
    files = marker.get("files") if isinstance(marker, dict) else None
    if files is None:
        return ""
    for rel, (size, digest) in sorted(files.items()):
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != size:
            return f"{rel} has {path.stat().st_size} bytes, the manifest says {size}"
        if _digest(path) != digest:
            return f"{rel} does not match its checksum"
    return ""


class CheckpointStore:
    def __init__(self, root: str | Path, keep_last: int = 2):
        self.root = Path(root)
        self.keep_last = keep_last

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first: one per step (a `.replaced-*` folder only when its step has no
        regular folder, i.e. a re-save was cut off between its two renames)."""
        if not self.root.is_dir():
            return []
        by_step: dict[int, Path] = {}
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if not m or not (p / MARKER).is_file():
                continue
            step = int(m.group(1))
            if step not in by_step or m.group(2) is None:
                by_step[step] = p
        return [by_step[s] for s in sorted(by_step)]

    def path_of(self, step: int) -> Path:
        """Where the checkpoint of step `step` lives once complete."""
        return self.root / f"step_{step:08d}"

    def latest_complete(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def latest_verified(self) -> Path | None:
        """The newest complete checkpoint that verifies; older ones are tried, with a warning, when it does not."""
        for path in reversed(self.complete()):
            problem = verify(path)
            if not problem:
                return path
            log.warning("checkpoint %s is damaged (%s); falling back to the one before it", path, problem)
        return None

    def begin(self, step: int) -> Path:
        """A fresh temporary folder to write step `step` into (leftovers of crashed saves are removed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in list(self.root.glob("*.partial-*")) + list(self.root.glob("*.pruning-*")):
            shutil.rmtree(stale, ignore_errors=True)
        for old in self.root.glob("step_*.replaced-*"):
            final = self.root / old.name.split(".")[0]
            if (final / MARKER).is_file():  # its replacement is complete
                shutil.rmtree(old, ignore_errors=True)
        tmp = Path(f"{self.path_of(step)}.partial-{os.getpid()}")
        tmp.mkdir()
        return tmp

    def commit(self, tmp: Path, step: int, info: dict | None = None) -> Path:
        """Make `tmp` durable, write the marker with its manifest last, rename into place, prune old ones."""
        files = seal(tmp)
        write_json(tmp / MARKER, {"step": step, "time": time.time(), **(info or {}), "files": files})
        _fsync_dir(tmp)
        final = self.path_of(step)
        aside = None
        if final.exists():  # the same step saved again (e.g. SIGTERM right after a periodic save)
            aside = final.with_name(f"{final.name}.replaced-{os.getpid()}")
            os.replace(final, aside)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        if aside is not None:
            self._remove(aside)
        for old in self.complete()[: -self.keep_last]:
            self._remove(old)
        return final

    def _remove(self, folder: Path) -> None:
        """Take `folder` out of the checkpoint names first, then delete it: never a half-deleted checkpoint."""
        doomed = folder.with_name(f"{folder.name}.pruning-{os.getpid()}")
        os.replace(folder, doomed)
        _fsync_dir(self.root)
        shutil.rmtree(doomed, ignore_errors=True)

    def resolve(self, resume: str) -> Path | None:
        """`` -> None; `auto` -> the newest verified checkpoint or None; a path -> that checkpoint (verified)."""
        if not resume:
            return None
        if resume == "auto":
            return self.latest_verified()
        path = Path(resume)
        if not (path / MARKER).is_file():
            raise FileNotFoundError(f"checkpoint.resume={resume!r} is not a complete checkpoint (no {MARKER})")
        problem = verify(path)
        if problem:
            raise FileNotFoundError(f"checkpoint.resume={resume!r} is damaged: {problem}")
        return path
