"""Hosts of the bench's own: network namespaces on one switch, every link shaped to a NIC's rate.

`NetLab(n, gbps)` makes n host namespaces (10.231.T.1 .. 10.231.T.n, T chosen per lab) and one switch namespace
holding a bridge. Each host reaches the switch over a veth pair whose two ends are both shaped with a token
bucket (`tc tbf`) to `gbps`: the host's end bounds what it sends, the switch's end what it receives, as a
full-duplex NIC would. Traffic stays between these namespaces; nothing reaches the machine's own interfaces.
Needs root and iproute2. `close()` kills every process left in the namespaces and deletes them.

On one machine the hosts still share its cores: a lab shows what a link rate does to a protocol (how many
times one sender's link is crossed), not what separate machines' CPUs would add.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def available() -> str:
    """Empty when a lab can be built here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not found (Debian's iproute2)" if missing else ""


class NetLab:
    def __init__(self, n_hosts: int, gbps: float):
        why = available()
        if why:
            raise RuntimeError(f"a shaped-link lab cannot be built: {why}")
        if not 1 <= n_hosts <= 200:
            raise ValueError(f"n_hosts must be 1..200, got {n_hosts}")
        if not 0 < gbps <= 100:
            raise ValueError(f"gbps must be in (0, 100], got {gbps}")
        tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        subnet = random.randrange(1, 255)
        self.gbps = gbps
        self.switch = f"agsw-{tag}"
        self.hosts = [f"agh{i}-{tag}" for i in range(n_hosts)]
        self.ips = [f"10.231.{subnet}.{i + 1}" for i in range(n_hosts)]
        rate, burst = f"{gbps * 1000:.0f}mbit", "512kb"  # burst above one GSO segment (64 KB)
        try:
            _sh("ip", "netns", "add", self.switch)
            _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i, (ns, ip) in enumerate(zip(self.hosts, self.ips)):
                _sh("ip", "netns", "add", ns)
                _sh("ip", "link", "add", f"h{i}-{tag}", "type", "veth", "peer", "name", f"p{i}-{tag}")
                _sh("ip", "link", "set", f"h{i}-{tag}", "netns", ns, "name", "eth0")
                _sh("ip", "link", "set", f"p{i}-{tag}", "netns", self.switch, "name", f"p{i}")
                _sh("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
                _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
                _sh("ip", "-n", ns, "link", "set", "eth0", "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                for where, dev in ((ns, "eth0"), (self.switch, f"p{i}")):
                    _sh("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
                        "latency", "200ms")
        except BaseException:
            self.close()
            raise

    def prefix(self, host: int) -> list[str]:
        """The command prefix that runs a program on host `host`."""
        return ["ip", "netns", "exec", self.hosts[host]]

    def close(self) -> None:
        for ns in (*self.hosts, self.switch):
            pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
            if pids:
                _sh("kill", "-9", *pids, check=False)
            _sh("ip", "netns", "del", ns, check=False)

    def __enter__(self) -> "NetLab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
