"""Entry points (train, eval, bench, splits, env_server), Ray wiring and placement.

Ray reads its listening settings when it is *imported*, not when it starts, so the loopback defaults are set
here, before any launch module can import Ray: a local Ray then listens on 127.0.0.1 only.
"""
import os as _os

_os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
_os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# `python -m launch.X` puts the working directory on sys.path as "" (relative): pin the checkout's absolute
# path, because Ray's job runtime may change the directory while the driver starts.
import sys as _sys
from pathlib import Path as _Path

_ROOT = str(_Path(__file__).resolve().parents[1])
if _ROOT not in _sys.path:
    _sys.path.insert(0, _ROOT)
