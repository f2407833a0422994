"""The trajectory channel's same-node path: a Unix socket beside TCP, taken only where it is really local."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from core.codec import WireLimits, encode
from core.curve import CurveClient, KeyPair, RunKeys
from core.transport import TrajectoryReceiver, TrajectorySender, node_id, pick_endpoint
from launch.bench.samples import make_trajectory

pytestmark = pytest.mark.skipif(not node_id(), reason="no node identity (boot id, network namespace): no same-node path")


def test_a_sender_on_the_node_takes_the_unix_socket_and_one_given_tcp_keeps_it():
    rx = TrajectoryReceiver(hwm=100)
    try:
        tcp, local = rx.endpoints.split()
        assert tcp == rx.endpoint and tcp.startswith("tcp://127.0.0.1:") and local.startswith("ipc://")
        folder = os.path.dirname(local[len("ipc://"):])
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700  # only the run's user may reach the socket
        near, far = TrajectorySender(rx.endpoints, name="near"), TrajectorySender(rx.endpoint, name="far")
        assert near.endpoint == local and far.endpoint == tcp
        for i in range(3):
            near.send(make_trajectory(num_tokens=40, trajectory_id=f"near-{i}"))
            far.send(make_trajectory(num_tokens=40, trajectory_id=f"far-{i}"))
        got = sorted(rx.recv(5000).trajectory_id for _ in range(6))
        assert got == sorted([f"near-{i}" for i in range(3)] + [f"far-{i}" for i in range(3)])
        assert rx.recv(50) is None and rx.stats.dropped == 0
        near.close()
        far.close()
    finally:
        rx.close()
    assert not os.path.exists(folder)  # the socket's folder goes with the receiver


def test_an_ipc_endpoint_of_another_kernel_or_without_its_socket_is_not_taken(tmp_path):
    tcp = "tcp://10.1.2.3:4000"
    assert pick_endpoint(f"{tcp} ipc:///tmp/agentgym-0123456789abcdef-x/trajectories") == tcp  # another machine
    missing = f"ipc://{tmp_path}/agentgym-{node_id()}-gone/trajectories"
    assert pick_endpoint(f"{tcp} {missing}") == tcp
    plain_file = tmp_path / f"agentgym-{node_id()}-file"
    plain_file.mkdir()
    (plain_file / "trajectories").write_text("not a socket")
    assert pick_endpoint(f"{tcp} ipc://{plain_file}/trajectories") == tcp
    assert pick_endpoint(tcp) == tcp


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_sender_in_another_network_namespace_counts_as_another_node():
    rx = TrajectoryReceiver()
    try:
        probe = "import sys; from core.transport import pick_endpoint; print(pick_endpoint(sys.argv[1]))"
        here = subprocess.run([sys.executable, "-c", probe, rx.endpoints], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.dirname(__file__)), timeout=60)
        there = subprocess.run(["unshare", "--net", sys.executable, "-c", probe, rx.endpoints], capture_output=True,
                               text=True, cwd=os.path.dirname(os.path.dirname(__file__)), timeout=60)
        assert here.stdout.strip() == rx.local_endpoint, here.stderr
        assert there.stdout.strip() == rx.endpoint, there.stderr  # the socket is reachable, but not its node
    finally:
        rx.close()


@pytest.mark.parametrize("cipher", ["aes-gcm", "curvezmq"])
def test_under_curve_the_local_sender_skips_curve_and_the_tcp_side_still_requires_it(cipher):
    keys = RunKeys.generate(["pool-0"], cipher=cipher)
    rx = TrajectoryReceiver(hwm=100, curve=keys.trajectory_server_side(["pool-0"]))
    try:
        near = TrajectorySender(rx.endpoints, name="pool-0", curve=keys.trajectory_client("pool-0"))
        far = TrajectorySender(rx.endpoint, name="pool-0", curve=keys.trajectory_client("pool-0"))
        outsider = CurveClient(keys.trajectory_server.public, KeyPair.generate(), cipher)  # a key not of the run
        stranger = TrajectorySender(rx.endpoint, name="stranger", curve=outsider)
        assert near.endpoint.startswith("ipc://") and far.endpoint.startswith("tcp://")
        assert (near._sealer, far._sealer is not None) == (None, cipher == "aes-gcm")
        near.send(make_trajectory(num_tokens=30, trajectory_id="near"), timeout_ms=30_000)
        far.send(make_trajectory(num_tokens=30, trajectory_id="far"), timeout_ms=30_000)
        try:  # aes-gcm: refused at the admission handshake, so there is no connection to send on at all
            stranger.send_frames(encode(make_trajectory(num_tokens=30, trajectory_id="forged")), timeout_ms=2000)
        except TimeoutError:
            assert cipher == "aes-gcm"
        got = {rx.recv(5000).trajectory_id for _ in range(2)}
        assert got == {"near", "far"}
        assert rx.recv(500) is None
        assert rx.auth_refused >= 1 and rx.stats.dropped == 0
        for tx in (near, far):
            tx.close()
        stranger.close(linger_ms=0)
    finally:
        rx.close()


def test_the_unix_socket_has_the_same_size_cap_as_tcp():
    limits = WireLimits(max_header_bytes=4096, max_tokens=1 << 12)
    rx = TrajectoryReceiver(hwm=100, limits=limits)
    try:
        big, small = TrajectorySender(rx.endpoints, name="big"), TrajectorySender(rx.endpoints, name="small")
        assert big.endpoint.startswith("ipc://") and small.endpoint.startswith("ipc://")
        big.send(make_trajectory(num_tokens=1 << 14, trajectory_id="too-big"))  # a frame over the cap
        small.send(make_trajectory(num_tokens=100, trajectory_id="fine"))
        got = []
        while (traj := rx.recv(1500)) is not None:
            got.append(traj.trajectory_id)
        assert got == ["fine"]
        big.close(linger_ms=0)
        small.close()
    finally:
        rx.close()


def test_same_node_off_advertises_tcp_only():
    rx = TrajectoryReceiver(same_node=False)
    try:
        assert rx.endpoints == rx.endpoint
    finally:
        rx.close()
