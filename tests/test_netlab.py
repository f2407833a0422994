"""The fan-out bench's lab: hosts in network namespaces of the test's own, links shaped to a NIC's rate. A
version crosses a shaped link no faster than the rate allows; relay and star both deliver it, with CURVE, to
subscribers on other hosts; and the namespaces are gone afterwards."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from launch.bench import netlab
from launch.bench.fanout import Hosts, fan_out


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_a_shaped_lab_carries_relay_and_star_at_the_link_rate_and_leaves_nothing_behind():
    if netlab.available():
        pytest.fail(f"this test needs a lab: {netlab.available()} (launch/install.sh installs iproute2)")
    gbps, mb = 0.25, 4
    with netlab.NetLab(3, gbps) as lab:
        made = {*lab.hosts, lab.switch}
        assert made <= namespaces()
        spec = {"publisher_ip": lab.ips[0], "subscriber_ips": lab.ips[1:],
                "prefixes": [lab.prefix(i) for i in (1, 2)]}
        code = f"""
import json, sys
import numpy as np
from launch.bench.fanout import Hosts, fan_out
spec = json.loads(sys.argv[1])
hosts = Hosts(spec["publisher_ip"], tuple(spec["subscriber_ips"]), tuple(map(tuple, spec["prefixes"])), curve=True)
payload = np.arange({mb} * 10**6 // 4, dtype=np.float32)
print(json.dumps({{f: fan_out(f, 2, payload, 1, 1 << 20, hosts) for f in ("relay", "star")}}))
"""
        run = subprocess.run([*lab.prefix(0), sys.executable, "-c", code, json.dumps(spec)], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        times = json.loads(run.stdout.strip().splitlines()[-1])
    one_link = mb * 1e6 / (gbps * 1e9 / 8)  # seconds for the version to cross one shaped link once
    assert times["relay"][0] > 0.8 * one_link, times  # the shaping holds
    assert times["star"][0] > 1.6 * one_link, times  # a star crosses the publisher's link once per subscriber
    assert not made & namespaces()


def test_the_loopback_fan_out_needs_no_lab():
    payload = np.arange((1 << 20) // 4, dtype=np.float32)
    load: dict = {}
    times = fan_out("relay", 1, payload, versions=1, chunk_bytes=1 << 18, hosts=Hosts(), load=load)
    assert len(times) == 1 and times[0] > 0 and 0 <= load["cores_busy"] <= 64
