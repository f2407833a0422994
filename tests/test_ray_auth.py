"""Ray's own ports are part of the run's boundary (the channel keys reach the actors through Ray's GCS).

A real one-node Ray per case, each inside a network namespace made by this test: on an address of the test's
own (10.213.8.1, off loopback) with and without Ray's token authentication, and on the namespace's loopback
without it. A driver inside the namespace joins it through `launch.job.ray_cluster.connect`, as a job's driver
does: without token authentication it is refused off loopback unless allow_insecure (and warned about
otherwise), naming RAY_AUTH_MODE=token; with it, it runs without a word. A local Ray the run starts checks a
token, refuses a driver without it, and writes no ~/.ray/auth_token. Teardown kills exactly the processes in
the namespace.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.training_runs import ROOT

pytestmark = pytest.mark.slow
NODE_IP = "10.213.8.1"
BIN = Path(sys.executable).parent
TOKEN = uuid.uuid4().hex * 2

DRIVER = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from launch.job.ray_cluster import cluster_auth_mode, connect
    joined = connect(sys.argv[1], allow_insecure=sys.argv[2] == "1", quiet=True)
    print("JOINED", joined, "MODE", cluster_auth_mode())
""")


def _env(mode: str, token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({"PATH": f"{BIN}:{env.get('PATH', '')}", "RAY_AUTH_MODE": mode, "RAY_USAGE_STATS_ENABLED": "0",
                "PYTHONPATH": str(ROOT)})
    if token:
        env["RAY_AUTH_TOKEN"] = token
    return env


@pytest.fixture(scope="module", params=["open-outside", "token-outside", "open-loopback"])
def node(request):
    """(namespace, address) of a one-node Ray: `open` without token authentication, `token` with it; on
    10.213.8.1 (`outside`) or on the namespace's own loopback."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("this test needs root and iproute2 (launch/install.sh installs iproute2)")
    auth, where = request.param.split("-")
    ns, temp = f"agra-{uuid.uuid4().hex[:6]}", Path(f"/tmp/agra-{uuid.uuid4().hex[:6]}")
    ip = NODE_IP if where == "outside" else "127.0.0.1"
    env = _env("token" if auth == "token" else "disabled", TOKEN if auth == "token" else None)
    if where == "loopback":
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every listener on 127.0.0.1 (see STACK.md)
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        if where == "outside":
            # a veth pair with both ends in the namespace: an interface that is not loopback, going nowhere
            subprocess.run(["ip", "-n", ns, "link", "add", "a0", "type", "veth", "peer", "name", "b0"], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{NODE_IP}/24", "dev", "a0"], check=True)
            for dev in ("a0", "b0"):
                subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        subprocess.run(["ip", "netns", "exec", ns, "ray", "start", "--head", f"--node-ip-address={ip}",
                        "--port=6379", "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={temp}"],
                       env=env, check=True, capture_output=True, timeout=120)
        yield request.param, ns, f"{ip}:6379"
    finally:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        if pids:
            subprocess.run(["kill", "-9", *pids], check=False)
        subprocess.run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(temp, ignore_errors=True)


def _drive(ns: str, address: str, allow_insecure: bool, mode: str, token: str | None, retries: int = 0):
    """The driver of a run joining `address`; `retries`: how often it tries Ray's GCS (0: Ray's default, 20,
    a second apart), for a driver that is refused."""
    env = {**_env(mode, token), **({"RAY_NUM_REDIS_GET_RETRIES": str(retries)} if retries else {})}
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", DRIVER, address,
                           "1" if allow_insecure else "0"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)


def test_joining_a_ray_without_token_auth_is_refused_off_loopback_and_warned_about(node):
    name, ns, address = node
    if name == "token-outside":
        run = _drive(ns, address, False, "token", TOKEN)
        assert run.returncode == 0, run.stderr[-3000:]
        assert f"JOINED {address} MODE token" in run.stdout
        assert "RAY_AUTH_MODE=token (" not in run.stderr  # no warning
        outsider = _drive(ns, address, True, "disabled", None, retries=2)  # no token: Ray itself refuses it
        assert outsider.returncode != 0 and "JOINED" not in outsider.stdout
        assert "InvalidAuthToken" in outsider.stderr, outsider.stderr[-3000:]  # refused, not timed out
        return
    for mode, token in (("disabled", None), ("token", TOKEN)):  # a driver in token mode asks the head node
        refused = _drive(ns, address, False, mode, token)
        if name == "open-outside":
            assert refused.returncode != 0 and "JOINED" not in refused.stdout, refused.stdout
            assert "refusing to run" in refused.stderr and "no token authentication" in refused.stderr
            assert "RAY_AUTH_MODE=token" in refused.stderr and "transport.allow_insecure=true" in refused.stderr
        else:  # on loopback: it runs, warned
            assert refused.returncode == 0, refused.stderr[-3000:]
            assert "WARNING" in refused.stderr and "RAY_AUTH_MODE=token" in refused.stderr
        allowed = _drive(ns, address, True, mode, token)
        assert allowed.returncode == 0, allowed.stderr[-3000:]
        assert f"JOINED {address} MODE disabled" in allowed.stdout
        assert "WARNING" in allowed.stderr and "no token authentication" in allowed.stderr


LOCAL = textwrap.dedent("""
    import os, subprocess, sys
    from launch.job.ray_cluster import cluster_auth_mode, connect, shutdown
    connect(num_cpus=1, quiet=True)
    import ray
    gcs = ray.get_runtime_context().gcs_address
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_NUM_REDIS_GET_RETRIES"] = "2"  # the outsider gives up after 2 refusals, not Ray's default 20
    outsider = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address='{gcs}')"], env=env,
                              capture_output=True, timeout=120)
    print("MODE", cluster_auth_mode(), "OUTSIDER", outsider.returncode,
          "REFUSED" if b"InvalidAuthToken" in outsider.stderr else "")
    shutdown()
""")


def test_a_local_ray_checks_a_token_it_never_writes_to_disk(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    run = subprocess.run([sys.executable, "-c", LOCAL], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    mode, outsider = run.stdout.split("MODE ")[1].split()[0], int(run.stdout.split("OUTSIDER ")[1].split()[0])
    assert mode == "token" and outsider != 0 and "REFUSED" in run.stdout, run.stdout  # for its token, not a timeout
    assert not (tmp_path / ".ray" / "auth_token").exists()
