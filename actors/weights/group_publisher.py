"""Learner rank 0's end of the weights group (actors.weights.group): the same narrow interface as the ZeroMQ
`WeightPublisher` (`endpoint`, `peers`, `wait_for_peers`, `publish`, `wait_acks`, `close`), so the learner and
launch treat both alike.

What must hold:
- The group forms in `wait_for_peers` (it blocks until every member has joined); publishing before that raises.
- `publish` announces a version's names, shapes and bucket plan, then sends the data in buckets of at most
  `bucket_bytes` (actors.weights.group_buckets): CUDA IPC when every worker reported that it sees rank 0's GPU
  (actors.weights.cuda_ipc), one broadcast per bucket otherwise. It returns only once every bucket has completed on
  the host (under NCCL too, where a Work's wait alone does not block the host); acks say the engines loaded it.
- A member that dies or stalls mid-version fails `publish` within `timeout_s` (the channel's ack timeout) with
  WeightsGroupError naming the version and bucket; the group is aborted then, never left to NCCL's watchdog,
  and every later `publish` raises that error at once.
- Acks come from the replicas named at start; an ack that does not decode counts as a refusal, with its reason.
"""
from __future__ import annotations

import logging
import socket
import time
from typing import Iterable

import msgpack
import torch

from actors.weights.group_buckets import plan, send_version
from actors.weights.group import Announcement, Group, WeightsGroupError, tensor_bytes, torch_dtype

log = logging.getLogger("agentgym.weights")


class CollectivePublisher:
    def __init__(self, host: str, port: int, replicas: list[str], workers_per_replica: int, device: torch.device,
                 dtype: str, timeout_s: float = 300.0, allow_ipc: bool = True, bucket_bytes: int = 512 << 20):
        """`replicas`: the names whose acks count; the group has 1 + len(replicas) * workers_per_replica ranks.
        `dtype`: the engines' dtype, sent on the wire. `bucket_bytes`: the largest bucket a version is sent in
        (each member holds at most two)."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(1024)
        self.host, self.port = host, int(self.listener.getsockname()[1])
        self.endpoint = f"tcp://{host}:{self.port}"
        self.replicas = list(replicas)
        self.world_size = 1 + len(replicas) * workers_per_replica
        self.device, self.dtype, self.timeout_s = device, dtype, timeout_s
        self.allow_ipc, self.bucket_bytes = allow_ipc, bucket_bytes
        self.peak_buffer_bytes = 0  # the most bytes of send buffers held at once, over every version
        self.group: Group | None = None
        self.mode = "broadcast"
        self.peers: dict[str, str] = {}
        self.seq_of: dict[int, int] = {}
        self.seq = 0
        self.published = -1
        self._drops = None
        self.zap = None  # no CURVE on this path (see actors.weights.group)
        self.relinked = 0
        self._exporter = None

    def wait_for_peers(self, n: int, timeout_s: float) -> None:
        """Form the group (every replica's workers join it); `n` is the number of replicas expected."""
        if self.group is not None:
            return
        if n != len(self.replicas):
            raise ValueError(f"weights group made for {len(self.replicas)} replicas, asked to wait for {n}")
        self.group = Group(self.host, self.port, 0, self.world_size, self.device, max(timeout_s, self.timeout_s),
                           listener=self.listener, allow_ipc=self.allow_ipc)
        self.listener.detach()  # the store owns the listening socket now, and closes it
        self.group.timeout_s = self.timeout_s
        if self.group.ipc:
            from actors.weights.cuda_ipc import Exporter

            self.mode, self._exporter = "ipc", Exporter(self.device)
        self.peers = {name: name for name in self.replicas}
        log.info("weights group: %d ranks, %s, %s", self.world_size, self.group.backend_name, self.mode)

    def publish(self, version: int, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Send `version` ((name, tensor) pairs; a tensor under two names goes once); returns bytes per member."""
        from actors.zero_engine import full_weight_layout, iter_full_weights  # imports DeepSpeed only when used

        named = list(tensors)
        specs, aliases = full_weight_layout(named)
        return self.publish_stream(version, specs, aliases, iter_full_weights(named))

    def publish_stream(self, version: int, specs: list[tuple[str, tuple[int, ...]]], aliases: list[tuple[str, str]],
                       tensors: Iterable[torch.Tensor]) -> int:
        """As `publish`, with the names and shapes given first and the tensors produced one at a time (a ZeRO-3
        gather yields each parameter only while it is gathered)."""
        if self.group is None:
            raise RuntimeError("the weights group is not formed yet (wait_for_peers)")
        if self.group.failed:
            for _ in tensors:  # the other learner ranks gather alongside rank 0 (ZeRO-3)
                pass
            raise WeightsGroupError(f"weights version {version} not sent: the group failed before: "
                                    f"{self.group.failed}")
        wire = torch_dtype(self.dtype)
        specs = [(name, tuple(shape)) for name, shape in specs]
        ann = Announcement(version, self.seq, self.dtype, self.mode, specs, list(aliases),
                           plan(specs, wire, self.bucket_bytes), self.bucket_bytes)
        self.seq_of[version] = self.seq
        self.seq += 1
        self.published = max(self.published, version)
        self.group.store.set(f"announce/{ann.seq}", ann.pack())
        if self.mode == "ipc":
            self._exporter.send(self.group, ann, tensors)
            self.peak_buffer_bytes = max(self.peak_buffer_bytes, self._exporter.staging.numel()
                                         if self._exporter.staging is not None else 0)
        else:
            buffers = send_version(self.group, ann, tensors, self.device)
            self.peak_buffer_bytes = max(self.peak_buffer_bytes, buffers.peak)
        return sum(tensor_bytes(shape, wire) for _, shape in specs)

    @property
    def drops(self):
        """Acks that did not decode, counted (core.transport.DropLog; imported when first asked for, so that this
        class needs neither ZeroMQ nor the channels' crypto: launch.gpu_device_check runs it with torch alone)."""
        if self._drops is None:
            from core.transport import DropLog

            self._drops = DropLog("weights ack", log)
        return self._drops

    def wait_acks(self, version: int, timeout_s: float, excused: Iterable[str] = ()) -> dict[str, tuple[bool, str]]:
        """{replica: (ok, error)} once every replica acked `version` (one in `excused`, known down, counts as
        skipped); TimeoutError naming those that did not."""
        seq = self.seq_of.get(version)
        if seq is None or self.group is None:
            raise ValueError(f"weights version {version} was not published on this group")
        deadline = time.monotonic() + timeout_s
        got: dict[str, tuple[bool, str]] = {}
        while True:
            for name in self.replicas:
                key = f"ack/{seq}/{name}"
                if name not in got and self.group.store.check([key]):
                    got[name] = self._ack(name, self.group.store.get(key))
            for name in set(excused) - set(got):
                if name in self.replicas:
                    got[name] = (False, "stalled: its process is down")
            missing = [n for n in self.replicas if n not in got]
            if not missing:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights version {version}: no ack from {', '.join(sorted(missing))}")
            time.sleep(0.02)

    def _ack(self, name: str, raw: bytes) -> tuple[bool, str]:
        try:
            body = msgpack.unpackb(raw[:4096], raw=False)
            if isinstance(body, dict) and isinstance(body.get("ok"), bool) and isinstance(body.get("error"), str):
                return body["ok"], body["error"][:1000]
        except Exception:  # counted below and reported as a refusal
            pass
        self.drops.drop(name, "ack", "not an ack")
        return False, "malformed ack"

    def close(self, linger_ms: int = 0) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        if self.listener.fileno() >= 0:  # never formed: the socket is still ours
            self.listener.close()
