"""Entry points (train, eval, bench, splits, env_server), Ray wiring and placement.

A role's process sends its output to its own log file from here on (core.role_log).

Ray reads its listening and authentication settings when it is *imported*, not when it starts, so the defaults
are set here, before any launch module can import Ray: a local Ray then listens on 127.0.0.1 only and checks
a token made for the run (launch.job.ray_cluster); a run that joins a cluster keeps that cluster's settings.
"""

# `python -m launch.X` puts the working directory on sys.path as "" (relative): pin the checkout's absolute
# path, because Ray's job runtime may change the directory while the driver starts.
import sys as _sys
from pathlib import Path as _Path

_ROOT = str(_Path(__file__).resolve().parents[1])
if _ROOT not in _sys.path:
    _sys.path.insert(0, _ROOT)

from core.role_log import capture_output as _capture_output  # noqa: E402
from launch.job.ray_cluster import apply_ray_env as _apply_ray_env  # noqa: E402

_capture_output()  # a role's process (e.g. a generator replica): its output goes to its log file

_apply_ray_env()
