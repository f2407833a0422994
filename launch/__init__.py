"""Entry points (train, eval, bench, splits, env_server), Ray wiring and placement.

Ray reads its listening settings when it is *imported*, not when it starts, so the loopback defaults are set
here, before any launch module can import Ray: a local Ray then listens on 127.0.0.1 only.
"""
import os as _os

_os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
_os.environ.setdefault("RAY_AUTH_MODE", "disabled")
