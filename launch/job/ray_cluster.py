"""Ray wiring: the only place that calls `ray.init`.

A run joins the cluster named by `ray.address` or RAY_ADDRESS (which `ray job submit` sets for the driver),
and otherwise starts a local Ray that listens on 127.0.0.1 only.

What must hold:
- Ray's own ports are part of the run's trust boundary: the run's channel keys reach its actors as call
  arguments (they pass through Ray's GCS and object store), and whoever reaches a Ray without token
  authentication can read them, or run code as the run's user. So a run that joins a cluster whose Ray has
  no token authentication (`RAY_AUTH_MODE=token` on every node) warns at start, naming the risk; when a node
  of that cluster is off loopback it refuses to run unless `transport.allow_insecure` (a trusted network).
- A local Ray a run starts uses Ray's token authentication, with a token made for this process and held in its
  environment (RAY_AUTH_TOKEN, inherited by the Ray processes it starts), never written to ~/.ray/auth_token:
  a token file there would make a later `ray start`, `ray status` or `ray job submit` fail with
  InvalidAuthToken. RAY_AUTH_MODE set by the user (e.g. `disabled`) is left as it is.
"""
from __future__ import annotations

import logging
import os
import secrets
import sys

from configs.run import is_loopback
from launch.job import ray_log_filter

log = logging.getLogger("agentgym.ray")

# A local Ray must stay on loopback and check a token. Ray reads these when it is imported: launch/__init__.py
# sets them before any launch module imports Ray; connect() sets them again for callers from elsewhere. A run
# that joins an existing cluster never touches RAY_AUTH_MODE: that cluster's token authentication stays as
# it is (and is checked by `check_cluster_auth`).
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}
TOKEN_SOURCES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
TOKEN_AUTH_DOCS = "https://docs.ray.io/en/latest/ray-security/token-auth.html"


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
    """The Ray environment this process sets (with setdefault) before Ray is imported: the loopback listener
    setting always, and token authentication for a local Ray."""
    if joins_cluster(argv, environ):
        return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": LOCAL_RAY_ENV["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]}
    return dict(LOCAL_RAY_ENV)


def apply_ray_env(argv: list[str] | None = None, starting: bool = False) -> list[str]:
    """Set `ray_env_defaults` in this process's environment, keeping what is set already; with token
    authentication and no token given, a token made here (so that Ray never writes one to ~/.ray/auth_token).
    Once Ray is imported (a Ray worker importing a launch module, say) the auth settings are left alone, as
    its raylet's, unless this process is `starting` Ray (connect). Returns the keys set."""
    defaults = ray_env_defaults(argv)
    if "ray" in sys.modules and not starting:
        defaults.pop("RAY_AUTH_MODE", None)
    elif defaults.get("RAY_AUTH_MODE") and os.environ.get("RAY_AUTH_MODE", "token") == "token" \
            and not any(os.environ.get(k) for k in TOKEN_SOURCES):
        defaults["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    set_here = [k for k in defaults if k not in os.environ]
    for key in set_here:
        os.environ[key] = defaults[key]
    return set_here


def _auth_mode_here() -> str:
    from ray._raylet import AuthenticationMode, get_authentication_mode

    return "token" if get_authentication_mode() == AuthenticationMode.TOKEN else "disabled"


def cluster_auth_mode() -> str:
    """"token" when the Ray cluster this process joined checks Ray's token, else "disabled". A driver that is
    not in token mode sends no token, so a cluster that let it in checks none; a driver in token mode sends
    its token to any cluster, so a task on the head node (where the GCS runs) says what that node's Ray runs
    with."""
    if _auth_mode_here() != "token":
        return "disabled"
    import ray

    def head_mode() -> str:  # defined here so that it travels by value: the head needs none of this code
        from ray._raylet import AuthenticationMode, get_authentication_mode

        return "token" if get_authentication_mode() == AuthenticationMode.TOKEN else "disabled"

    probe = ray.remote(num_cpus=0, resources={"node:__internal_head__": 0.001}, max_retries=0)(head_mode)
    return ray.get(probe.remote(), timeout=120)


def check_cluster_auth(address: str, allow_insecure: bool) -> str:
    """After joining `address`: its auth mode, "token" or "disabled". Without token authentication: a
    warning naming the risk when every node is on loopback (or `allow_insecure`), else SystemExit."""
    mode = cluster_auth_mode()
    if mode == "token":
        log.info("Ray at %s checks Ray's auth token (RAY_AUTH_MODE=token)", address)
        return mode
    import ray

    nodes = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")})
    outside = [a for a in nodes if not is_loopback(a)]
    risk = (f"the Ray cluster at {address} has no token authentication: whoever reaches its ports (nodes "
            f"{', '.join(nodes)}) can read the run's channel keys, which reach the actors as call arguments "
            "through Ray's GCS, and run code as the run's user; start every node of the cluster with "
            f"RAY_AUTH_MODE=token ({TOKEN_AUTH_DOCS})")
    if outside and not allow_insecure:
        ray.shutdown()
        raise SystemExit(f"launch: refusing to run: {risk}, or set transport.allow_insecure=true on a trusted "
                         "cluster network")
    log.warning("%s%s", risk, " (transport.allow_insecure=true)" if outside else "")
    return mode


def connect(address: str = "", num_cpus: int = 0, namespace: str = "agentgym-rl",
            runtime_env: dict | None = None, num_gpus: int | None = None, quiet: bool = False,
            allow_insecure: bool = False) -> str:
    """Join or start Ray; returns "local" or the address joined. Safe to call twice. `num_gpus`: the GPUs a
    local Ray declares (None: the ones it detects). `quiet`: Ray's own INFO lines in this process are not
    printed (its warnings are); a raylet's warning that repeats on a timer is shown once, then every 10 min
    with its count (`launch.job.ray_log_filter`). Joining a cluster without Ray's token authentication warns, and
    off loopback refuses unless `allow_insecure` (`check_cluster_auth`)."""
    address = address or os.environ.get("RAY_ADDRESS", "")
    imported = "ray" in sys.modules
    set_here = apply_ray_env([f"ray.address={address}"] if address else [], starting=True)
    import ray

    if ray.is_initialized():
        return "existing"
    if imported and "RAY_AUTH_MODE" in set_here:  # Ray read the mode when imported: re-read it, as Ray itself
        from ray._raylet import Config         # does when it turns token authentication on

        Config.initialize("")
    if address:
        ray.init(address=address, namespace=namespace, runtime_env=runtime_env, log_to_driver=True,
                 logging_level=logging.WARNING if quiet else logging.INFO)
        ray_log_filter.install()
        check_cluster_auth(address, allow_insecure)
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
