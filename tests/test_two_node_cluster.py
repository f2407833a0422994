"""A real two-node Ray cluster on this machine, and a short run submitted to it with `ray job submit`.

Each Ray node lives in its own network namespace made by this test (a veth pair, 10.213.7.1 <-> 10.213.7.2),
so the nodes reach each other over addresses of the test's own; nothing leaves the machine. The cluster runs
with Ray's token authentication (RAY_AUTH_MODE=token, the token in the environment). Each node also gets
its own Ray temp dir: two nodes sharing one would unpack the job's working dir over each other. Teardown kills
exactly the processes inside the two namespaces (never `ray stop`, which would stop every Ray on the machine).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.training_runs import ROOT, TINY_RECIPE

pytestmark = pytest.mark.slow
HEAD_IP, WORKER_IP = "10.213.7.1", "10.213.7.2"
BIN = Path(sys.executable).parent
TOKEN = uuid.uuid4().hex * 2


def sh(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


def in_ns(ns: str, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # Both nodes, the CLI and the job's driver check Ray's token (a run refuses to join a Ray without it off
    # loopback); the token lives in the environment, never in ~/.ray/auth_token.
    env.update({"PATH": f"{BIN}:{env.get('PATH', '')}", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN,
                "RAY_USAGE_STATS_ENABLED": "0"})
    return subprocess.run(["ip", "netns", "exec", ns, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=check)


@pytest.fixture(scope="module")
def two_nodes():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("this test needs root and iproute2 (launch/install.sh installs iproute2)")
    tag = uuid.uuid4().hex[:6]
    head, worker = f"agh-{tag}", f"agw-{tag}"
    temp = {head: Path(f"/tmp/agr-h-{tag}"), worker: Path(f"/tmp/agr-w-{tag}")}
    try:
        sh("ip", "netns", "add", head)
        sh("ip", "netns", "add", worker)
        sh("ip", "link", "add", f"veh-{tag}", "type", "veth", "peer", "name", f"vew-{tag}")
        for ns, dev, ip in ((head, f"veh-{tag}", HEAD_IP), (worker, f"vew-{tag}", WORKER_IP)):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        in_ns(head, "ray", "start", "--head", f"--node-ip-address={HEAD_IP}", "--port=6379", "--num-cpus=2",
              f"--dashboard-host={HEAD_IP}", f"--temp-dir={temp[head]}")
        in_ns(worker, "ray", "start", f"--address={HEAD_IP}:6379", f"--node-ip-address={WORKER_IP}",
              "--num-cpus=2", f"--temp-dir={temp[worker]}")
        deadline = time.monotonic() + 90
        while (status := in_ns(head, "ray", "status", f"--address={HEAD_IP}:6379").stdout).count("node_") < 2:
            assert time.monotonic() < deadline, status  # both nodes must join before any test submits a job
            time.sleep(2)
        yield head, worker
    finally:
        for ns in (head, worker):
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            if pids:
                sh("kill", "-9", *pids, check=False)
        for ns in (head, worker):
            sh("ip", "netns", "del", ns, check=False)
        for path in temp.values():
            shutil.rmtree(path, ignore_errors=True)


def test_loopback_transport_is_refused_on_a_multi_node_cluster(two_nodes, tiny_model_dir, tmp_path):
    head, _ = two_nodes
    job = in_ns(head, "ray", "job", "submit", f"--address=http://{HEAD_IP}:8265", "--working-dir", str(ROOT), "--",
                "python", "-m", "launch.train", "--config", str(TINY_RECIPE.relative_to(ROOT)),
                f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}", timeout=300, check=False)
    assert job.returncode != 0
    assert "transport.host" in job.stdout + job.stderr


def test_ray_job_submit_runs_on_both_nodes_and_curve_keeps_an_outsider_out(two_nodes, tiny_model_dir, tmp_path):
    """`ray job submit` of a run whose env actors land on both nodes. transport.auth=auto on a non-loopback host:
    CURVE. An intruder in the worker's namespace, knowing the endpoints and public keys, can neither push,
    subscribe nor ack; the run trains unaffected."""
    head, worker = two_nodes
    out, report = tmp_path / "run", tmp_path / "intruder.json"
    intruder = subprocess.Popen(
        ["ip", "netns", "exec", worker, sys.executable, "-m", "tests.net_intruder", str(out), "240", str(report)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        job = in_ns(head, "ray", "job", "submit", f"--address=http://{HEAD_IP}:8265", "--working-dir", str(ROOT),
                    "--", "python", "-m", "launch.train", "--config", str(TINY_RECIPE.relative_to(ROOT)),
                    f"model.path={tiny_model_dir}", f"trainer.output_dir={out}", "trainer.total_steps=3",
                    "env.num_actors=2", "transport.host=0.0.0.0", "eval.at_end=false",
                    "logging.wandb_mode=disabled", timeout=900, check=False)
    finally:
        intruder.terminate()
        _, err = intruder.communicate(timeout=60)
    log = job.stdout + job.stderr
    assert job.returncode == 0, log[-4000:]
    assert "succeeded" in log
    placement = json.loads((out / "placement.json").read_text())
    assert sorted(placement["EnvPool"]) == [HEAD_IP, WORKER_IP], placement  # env actors on both nodes
    assert [r["step"] for r in map(json.loads, (out / "trained.jsonl").read_text().splitlines())] == [1, 2, 3]
    transport = json.loads((out / "transport.json").read_text())
    assert transport["auth"] == "curve" and transport["trajectory_endpoint"].startswith(f"tcp://{HEAD_IP}:")
    assert "0.0.0.0" not in transport["weights_endpoint"]
    assert report.exists(), err[-2000:]
    seen = json.loads(report.read_text())
    assert seen["saw_transport_json"] and seen["trajectory_attempts"] > 0 and seen["weights_attempts"] > 0, seen
    assert seen["chunks_received"] == 0, seen  # no weights reached the outsider
    trained = [t for r in map(json.loads, (out / "trained.jsonl").read_text().splitlines())
               for t in r["trajectories"]]
    assert "g0000000-babyai_0.a0.s0" not in trained or len(trained) == len(set(trained))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1].get("transport/bad_messages", 0) == 0  # nothing forged even reached a decoder
    # The intruder speaks ZeroMQ's NULL or CURVE mechanism, so the listeners' admission handshake (PLAIN,
    # core.admission) is refused by ZeroMQ itself before any message is read, and not counted in
    # transport/auth_refused (which counts wrong keys and tokens, tests/test_channel_auth.py).


def test_auth_off_off_loopback_is_refused_at_start(two_nodes, tiny_model_dir, tmp_path):
    head, _ = two_nodes
    job = in_ns(head, "ray", "job", "submit", f"--address=http://{HEAD_IP}:8265", "--working-dir", str(ROOT), "--",
                "python", "-m", "launch.train", "--config", str(TINY_RECIPE.relative_to(ROOT)),
                f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}", "transport.host=0.0.0.0",
                "transport.auth=off", timeout=300, check=False)
    assert job.returncode != 0
    assert "transport.auth" in job.stdout + job.stderr and "allow_insecure" in job.stdout + job.stderr


def test_learner_ranks_that_would_span_the_nodes_are_refused_without_allow_insecure(two_nodes, tiny_model_dir,
                                                                                    tmp_path):
    """Two ranks of 1.5 CPUs fit the cluster (4 CPUs) but neither node (2 each): their rendezvous would cross
    the network unauthenticated, so the run refuses at start, naming the keys."""
    head, _ = two_nodes
    job = in_ns(head, "ray", "job", "submit", f"--address=http://{HEAD_IP}:8265", "--working-dir", str(ROOT), "--",
                "python", "-m", "launch.train", "--config", str(TINY_RECIPE.relative_to(ROOT)),
                f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}", "transport.host=0.0.0.0",
                "learner.num_ranks=2", "learner.num_cpus_per_rank=1.5", timeout=300, check=False)
    log = job.stdout + job.stderr
    assert job.returncode != 0
    assert "fit on no single node" in log and "learner.num_ranks = 2" in log and "allow_insecure" in log, log[-3000:]
