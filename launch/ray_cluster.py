"""Ray wiring: the only place that calls `ray.init`.

A run joins the cluster named by `ray.address` or RAY_ADDRESS (which `ray job submit` sets for the driver),
and otherwise starts a local Ray that listens on 127.0.0.1 only.
"""
from __future__ import annotations

import logging
import os
import sys

from launch import ray_log_filter

# A local Ray must stay on loopback, and a local ray.init must not write an auth token that later breaks
# `ray start` / `ray job submit`. Ray reads these when it is imported: launch/__init__.py sets them before
# any launch module imports Ray; connect() sets them again for callers from elsewhere. A run that joins an
# existing cluster never touches RAY_AUTH_MODE: that cluster's token authentication stays as it is.
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


def joins_address(address: str, environ: dict | None = None) -> bool:
    """Whether a run with `ray.address=address` joins an existing Ray cluster (that, or RAY_ADDRESS, which
    `ray job submit` sets) rather than start a local one."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("RAY_ADDRESS") or address.strip("'\""))


def joins_cluster(argv: list[str] | None = None, environ: dict | None = None) -> bool:
    """`joins_address` before the config is loaded: from a `ray.address=` override on the command line."""
    argv = sys.argv if argv is None else argv
    given = [a.split("=", 1)[1] for a in argv if a.startswith("ray.address=")]
    return joins_address(given[-1] if given else "", environ)


def ray_env_defaults(argv: list[str] | None = None, environ: dict | None = None) -> dict[str, str]:
    """The Ray environment this process sets before Ray is imported: the loopback listener setting always,
    and auth off only for a local Ray."""
    if joins_cluster(argv, environ):
        return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": LOCAL_RAY_ENV["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]}
    return dict(LOCAL_RAY_ENV)


def connect(address: str = "", num_cpus: int = 0, namespace: str = "agentgym-rl",
            runtime_env: dict | None = None, num_gpus: int | None = None, quiet: bool = False) -> str:
    """Join or start Ray; returns "local" or the address joined. Safe to call twice. `num_gpus`: the GPUs a
    local Ray declares (None: the ones it detects). `quiet`: Ray's own INFO lines in this process are not
    printed (its warnings are); a raylet's warning that repeats on a timer is shown once, then every 10 min
    with its count (`launch.ray_log_filter`)."""
    address = address or os.environ.get("RAY_ADDRESS", "")
    defaults = ray_env_defaults([f"ray.address={address}"] if address else [])
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return "existing"
    if address:
        ray.init(address=address, namespace=namespace, runtime_env=runtime_env, log_to_driver=True,
                 logging_level=logging.WARNING if quiet else logging.INFO)
        ray_log_filter.install()
        return address
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus, namespace=namespace,
             _node_ip_address="127.0.0.1", include_dashboard=False, runtime_env=runtime_env,
             log_to_driver=True, logging_level=logging.WARNING if quiet else logging.INFO)
    ray_log_filter.install()
    return "local"


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
