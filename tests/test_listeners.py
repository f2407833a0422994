"""What the run's helper listeners bind: the learners' rendezvous store only the address it advertises, the
SciWorld py4j gateway only with its auth token; and Ray's token authentication is set for a local Ray and
left alone for a job that joins a cluster."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from launch.job.ray_cluster import joins_cluster, ray_env_defaults
from tests.training_runs import ROOT

RENDEZVOUS = textwrap.dedent("""
    import os, socket
    from actors import zero_engine
    sock = zero_engine.listen_socket("127.0.0.1")
    port = sock.getsockname()[1]
    zero_engine.init_process_group(0, 1, "127.0.0.1", port, use_gpu=False, timeout_s=60, listener=sock)
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            inodes.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f"socket:[{f[9]}]" in inodes:  # LISTEN, owned by this process
                listening.append(f[1])
    print("LISTEN", " ".join(listening))
""")


def _hex_ip(local: str) -> str:
    addr = local.split(":")[0]
    if len(addr) == 8:  # IPv4, little-endian hex
        return ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return addr


def test_rendezvous_and_process_group_listen_on_the_advertised_address_only():
    out = subprocess.run([sys.executable, "-c", RENDEZVOUS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("LISTEN"))
    addresses = [_hex_ip(a) for a in line.split()[1:]]
    assert addresses, line
    assert all(a == "127.0.0.1" for a in addresses), addresses  # never 0.0.0.0 or ::


@pytest.mark.parametrize("argv, environ, joins", [
    ([], {}, False),
    (["ray.address="], {}, False),
    (["ray.address=10.0.0.1:6379"], {}, True),
    ([], {"RAY_ADDRESS": "http://10.0.0.1:8265"}, True),
])
def test_ray_token_auth_is_set_only_for_a_local_ray(argv, environ, joins):
    assert joins_cluster(argv, environ) == joins
    env = ray_env_defaults(argv, environ)
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert env.get("RAY_AUTH_MODE") == (None if joins else "token")


def test_sciworld_gateway_refuses_a_client_without_its_token():
    from py4j.java_gateway import GatewayParameters, JavaGateway

    from environments.sciworld.simulator import Simulator

    sim = Simulator()
    try:
        params = sim._gateway.gateway_parameters
        assert params.auth_token  # the simulator's own connection authenticates
        intruder = JavaGateway(gateway_parameters=GatewayParameters(port=params.port, auto_field=True))
        with pytest.raises(Exception):  # py4j answers an unauthenticated command with an error
            intruder.jvm.java.lang.System.getProperty("user.home")
        intruder.close()
    finally:
        sim.close()
