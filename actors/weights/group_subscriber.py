"""A generator replica's control end of the weights group (actors.weights.group): it reads announcements from
the group's store and writes acks there. The data goes to the replica's vLLM worker(s), which joined the group
themselves (actors.weights.vllm_worker); this process only takes part in the control.

What must hold:
- Announcements are taken in order (`announce/0`, `announce/1`, ...), each exactly once; one that does not decode
  is still handed on (as `None`), because the workers must take part in its broadcasts all the same, and is
  acked as refused.
- The wait for the next announcement stops within a poll interval of `stop()` becoming true.
"""
from __future__ import annotations

import datetime
import time

import msgpack

from actors.weights.group import PREFIX, Announcement
from core.trajectory import WireError


class CollectiveSubscriber:
    def __init__(self, endpoint: str, name: str, timeout_s: float):
        import torch.distributed as dist

        host, port = parse_endpoint(endpoint)
        self.host, self.port, self.name = host, port, name
        self._raw = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        self.store = dist.PrefixStore(PREFIX, self._raw)
        self.seq = 0

    def next(self, stop, poll_s: float = 0.05) -> tuple[int, bytes, Announcement | None, str] | None:
        """(seq, raw announcement, the decoded one or None, why not) for the next announcement; None on stop."""
        key = f"announce/{self.seq}"
        while not self.store.check([key]):
            if stop():
                return None
            time.sleep(poll_s)
        raw = self.store.get(key)
        seq, self.seq = self.seq, self.seq + 1
        try:
            return seq, raw, Announcement.unpack(raw), ""
        except WireError as exc:
            return seq, raw, None, str(exc)

    def ack(self, seq: int, ok: bool, error: str = "") -> None:
        self.store.set(f"ack/{seq}/{self.name}", msgpack.packb({"ok": ok, "error": error[:1000]}))


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) of "tcp://host:port"; ValueError naming the endpoint otherwise."""
    rest = endpoint.removeprefix("tcp://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"weights group endpoint {endpoint!r}: expected tcp://host:port")
    return host, int(port)
