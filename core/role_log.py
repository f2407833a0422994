"""Per-role log files: a role's process writes what it and the libraries in it print (vLLM, DeepSpeed, Ray's
worker, Python warnings) to its own file, and only this project's warnings and errors reach the terminal.

The launcher names the file in the actor's environment (`AGENTGYM_ROLE_LOG`, in its Ray runtime env) and
`capture_output()` runs when the process first imports `actors` or `launch` (before any library prints at
import time). It points file descriptors 1 and 2 at the file, so the processes the role starts later
(vLLM's engine core, a JVM, a browser) write there too. The project's loggers (`agentgym.*`) log INFO and above
to the file and, at WARNING and above, to the process's original stderr, which Ray forwards to the driver's
terminal prefixed with the actor's name. Without the variable (the driver, `--verbose`, tests) nothing changes.
"""
from __future__ import annotations

import logging
import os
import sys

ROLE_LOG = "AGENTGYM_ROLE_LOG"
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def capture_output(environ: dict | None = None) -> str:
    """Send this process's output to the file `AGENTGYM_ROLE_LOG` names (once); returns that path or ""."""
    path = (os.environ if environ is None else environ).get(ROLE_LOG, "")
    if not path or _same_file(2, path):  # not a role, or already captured (a child that inherited it)
        return ""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    ours = logging.getLogger("agentgym")
    ours.setLevel(logging.INFO)
    to_file = logging.StreamHandler(sys.stderr)  # fd 2: the file now
    to_file.setFormatter(logging.Formatter(FORMAT))
    to_terminal = logging.StreamHandler(terminal)
    to_terminal.setLevel(logging.WARNING)
    to_terminal.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    ours.addHandler(to_file)
    ours.addHandler(to_terminal)
    ours.propagate = False  # a root handler that a library adds must not print our lines a second time
    return path
