"""Ray wiring: the only place that calls `ray.init`.

A run joins the cluster named by `ray.address` or RAY_ADDRESS (which `ray job submit` sets for the driver),
and otherwise starts a local Ray that listens on 127.0.0.1 only.
"""
from __future__ import annotations

import os

# A local Ray must stay on loopback, and a local ray.init must not write an auth token that later breaks
# `ray start` / `ray job submit`. Ray reads these when it is imported: launch/__init__.py sets them before
# any launch module imports Ray; connect() sets them again for callers from elsewhere.
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


def connect(address: str = "", num_cpus: int = 0, namespace: str = "agentgym-rl",
            runtime_env: dict | None = None) -> str:
    """Join or start Ray; returns "local" or the address joined. Safe to call twice."""
    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return "existing"
    address = address or os.environ.get("RAY_ADDRESS", "")
    if address:
        ray.init(address=address, namespace=namespace, runtime_env=runtime_env, log_to_driver=True)
        return address
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), namespace=namespace,
             _node_ip_address="127.0.0.1", include_dashboard=False, runtime_env=runtime_env,
             log_to_driver=True)
    return "local"


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
