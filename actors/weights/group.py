"""Weights by collective (`transport.weights_sync=collective`): learner rank 0 broadcasts each version straight into
every generator replica's vLLM worker(s), GPU to GPU with NCCL, or host to host with gloo on CPU (the same code).

Rank 0 and every replica's worker processes form a process group of their own (a TCPStore served by rank 0 and
a gloo or NCCL backend made directly on it; no `init_process_group`, so the learners' own group and vLLM's are
untouched). Group rank 0 is the learner; a replica's workers take ranks `rank_offset + worker rank`.

Control (msgpack values in the group's store, each checked on decode):
  rank 0        `source`            {"gpu"}: rank 0's GPU UUID ("" on CPU)
  each worker   `member/<rank>`     {"gpu"}: whether it sees rank 0's GPU (CUDA IPC is then possible)
  rank 0        `plan`              {"backend", "ipc"}: nccl (GPUs) or gloo (CPU, or barriers only with IPC)
  rank 0        `announce/<seq>`    {"version", "dtype", "mode", "tensors": [[name, shape], ...],
                                     "aliases": [[name, source name], ...], "bucket_bytes", "buckets": [...]}
  each replica  `ack/<seq>/<name>`  {"ok", "error"}
Data moves in buckets of at most `bucket_bytes` (transport.weights_bucket_mb; actors.weights.group_buckets): the
tensors, in the announced order and (wire) dtype, packed at 256-byte aligned offsets. `mode` "broadcast": one
broadcast per bucket, through two buffers on each member (the next bucket arrives while this one loads); "ipc":
rank 0 fills a staging bucket and announces its CUDA IPC handle (actors.weights.cuda_ipc), the workers load straight
from it, and one all-reduce per bucket says every worker is done with it.

What must hold:
- Names, dtype and shapes are announced before any data, so a receiver allocates exactly what arrives. The wire
  dtype is the engine's (`model.dtype`): rank 0 casts, a receiver casts again only if its engine differs.
- A tensor sent under two names (tied embeddings) is broadcast once and announced as an alias.
- A receiver that refuses a version still takes part in every broadcast (and drops the data): a member that
  left the sequence would hang the others until the group's timeout.
- Every member must take part in every version: a member that dies or stalls fails the version within
  `timeout_s` of its start with WeightsGroupError (named), on every member still waiting, never by NCCL's
  watchdog: each wait polls the collective's completion on the host against that deadline (NCCL's own timeout
  is set beyond it), and a member that gives up aborts its backend. A failed group stays failed; the run's
  failure handling rebuilds its roles, the group is not re-formed around a member.
- The store and the backends are not authenticated: off loopback the cluster network has to be trusted.
"""
from __future__ import annotations

import datetime
import math
import socket
import time
from dataclasses import dataclass, field

import msgpack
import torch
import torch.distributed as dist

from core.trajectory import WireError

PREFIX = "agentgym-weights"
MAX_META = 64 << 20  # an announcement of a model with ~100k tensors; checked before decoding
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


MAX_BUCKET = 1 << 36  # a bucket_bytes past this is not a plan but a corrupt announcement


class WeightsGroupError(RuntimeError):
    """A version could not move through the weights group (a member died, stalled past the deadline, or the
    group failed before); the message names the version, the bucket and the member's rank."""


@dataclass
class Announcement:
    """One version's index. `tensors` in send order; `buckets`: per bucket, its tensors' byte offsets, exactly
    `actors.weights.group_buckets.plan(tensors, dtype, bucket_bytes)` (checked on decode)."""

    version: int
    seq: int  # this group's count of announcements before this one (names the IPC keys)
    dtype: str
    mode: str  # broadcast or ipc
    tensors: list[tuple[str, tuple[int, ...]]]
    aliases: list[tuple[str, str]] = field(default_factory=list)
    buckets: list[list[int]] = field(default_factory=list)  # bucket b holds the next len(buckets[b]) tensors
    bucket_bytes: int = 1 << 30

    def pack(self) -> bytes:
        return msgpack.packb({"version": self.version, "seq": self.seq, "dtype": self.dtype, "mode": self.mode,
                              "tensors": [[n, list(s)] for n, s in self.tensors],
                              "aliases": [list(a) for a in self.aliases], "buckets": self.buckets,
                              "bucket_bytes": self.bucket_bytes})

    @classmethod
    def unpack(cls, raw: bytes) -> "Announcement":
        """Decode and check; raises WireError naming the field."""
        if len(raw) > MAX_META:
            raise WireError("announcement", f"{len(raw)} bytes, more than {MAX_META}")
        try:
            body = msgpack.unpackb(raw, raw=False)
        except Exception as exc:
            raise WireError("announcement", f"not valid msgpack ({type(exc).__name__})") from None
        if not isinstance(body, dict):
            raise WireError("announcement", "expected a map")
        version, dtype, mode = body.get("version"), body.get("dtype"), body.get("mode")
        for key in ("version", "seq"):
            value = body.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise WireError(key, f"expected an int >= 0, got {value!r:.40}")
        if dtype not in FLOAT_DTYPES:
            raise WireError("dtype", f"expected one of {FLOAT_DTYPES}, got {dtype!r:.40}")
        if mode not in ("broadcast", "ipc"):
            raise WireError("mode", f"expected broadcast or ipc, got {mode!r:.40}")
        tensors = []
        for item in body.get("tensors") or []:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], list)
                    and all(isinstance(d, int) and 0 <= d < 1 << 40 for d in item[1])):
                raise WireError("tensors", f"expected [name, shape], got {item!r:.80}")
            tensors.append((item[0], tuple(item[1])))
        names = {n for n, _ in tensors}
        if len(names) != len(tensors):
            raise WireError("tensors", "a name is announced twice")
        aliases = []
        for item in body.get("aliases") or []:
            if not (isinstance(item, list) and len(item) == 2 and item[1] in names and isinstance(item[0], str)
                    and item[0] not in names):
                raise WireError("aliases", f"expected [new name, announced name], got {item!r:.80}")
            aliases.append((item[0], item[1]))
        bucket_bytes = body.get("bucket_bytes")
        if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool) or not 0 < bucket_bytes <= MAX_BUCKET:
            raise WireError("bucket_bytes", f"expected an int in (0, {MAX_BUCKET}], got {bucket_bytes!r:.40}")
        from actors.weights.group_buckets import plan  # the plan is recomputed here, never taken on trust

        buckets = body.get("buckets")
        if buckets != plan(tensors, torch_dtype(dtype), bucket_bytes):
            raise WireError("buckets", "the buckets are not the plan of these tensors and bucket_bytes")
        return cls(version, body["seq"], dtype, mode, tensors, aliases, buckets, bucket_bytes)


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def local_address(host: str, port: int) -> str:
    """The address of this machine on the route to (host, port): where this member's gloo device listens."""
    if host.startswith("127.") or host == "localhost":
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # no packet is sent: this only picks the route
        return s.getsockname()[0]


class Group:
    """One member of the weights group: the store, the backend, this member's rank and device."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: torch.device,
                 timeout_s: float, listener: socket.socket | None = None, allow_ipc: bool = True):
        """Join (rank 0: serve the store on `listener` and decide the plan); blocks until every member joined."""
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.size, self.device, self.timeout_s = rank, world_size, device, timeout_s
        master = rank == 0
        self.raw_store = dist.TCPStore(host, port, world_size, master, timeout, wait_for_workers=False,
                                       master_listen_fd=listener.fileno() if master and listener else None)
        self.store = dist.PrefixStore(PREFIX, self.raw_store)
        if master:
            self.store.set("source", msgpack.packb({"gpu": gpu_uuid(device)}))
        self.source_gpu = _str_field(self.store.get("source"), "gpu")
        self.source_index = visible_index(self.source_gpu)  # this process's index of rank 0's GPU, if it sees it
        if not master:
            self.store.set(f"member/{rank}", msgpack.packb({"gpu": self.source_index is not None}))
        else:
            seen = [msgpack.unpackb(self.store.get(f"member/{r}")).get("gpu") is True for r in range(1, world_size)]
            # CUDA IPC when every worker can open rank 0's memory; its barriers then go over gloo, since NCCL
            # refuses two ranks on one GPU (colocated workers).
            ipc = allow_ipc and device.type == "cuda" and all(seen)
            self.store.set("plan", msgpack.packb({"backend": "nccl" if device.type == "cuda" and not ipc else "gloo",
                                                  "ipc": ipc}))
        plan = msgpack.unpackb(self.store.get("plan"))
        self.backend_name, self.ipc = plan["backend"], plan["ipc"] is True
        if self.backend_name == "nccl" and device.type != "cuda":
            raise RuntimeError(f"weights group: rank 0 broadcasts with NCCL, rank {rank} is on {device}")
        if self.backend_name == "gloo" and device.type != "cpu" and not self.ipc:
            raise RuntimeError(f"weights group: rank 0 is on the CPU (gloo), rank {rank} is on {device}")
        self.comm_device = device if self.backend_name == "nccl" else torch.device("cpu")
        data = dist.PrefixStore("pg", self.store)
        # The backend's own timeout lies past every deadline this group waits with (`finish`): a stalled member
        # is named here, and the group aborted, before NCCL's watchdog would take the process down.
        op_timeout = datetime.timedelta(seconds=2 * timeout_s + 60)
        if self.backend_name == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = op_timeout
            self.backend = dist.ProcessGroupNCCL(data, rank, world_size, options)
        else:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = op_timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address(host, port))]
            self.backend = dist.ProcessGroupGloo(data, rank, world_size, options)
        self.failed = ""  # why the group failed; every later operation raises it
        self.barrier(time.monotonic() + timeout_s)  # the group is formed when every member has joined

    def deadline(self) -> float:
        """The deadline of an operation starting now: `timeout_s` from now (monotonic seconds)."""
        return time.monotonic() + self.timeout_s

    def start_broadcast(self, tensor: torch.Tensor):
        """Start broadcasting `tensor` from rank 0; returns the Work to `finish`."""
        self._check()
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        return self.backend.broadcast([tensor], opts)

    def finish(self, work, deadline: float, what: str, poll_s: float = 0.0005) -> None:
        """Wait on the host until `work` has completed (under NCCL: its end event on the GPU, so the bytes have
        moved), at most until `deadline`. Past it, or when the work failed, the group is aborted and
        WeightsGroupError names `what`."""
        while not work.is_completed():
            if time.monotonic() > deadline:
                self.fail(f"{what}: not completed by every member within {self.timeout_s:.0f} s")
            time.sleep(poll_s)
        try:
            work.wait()  # raises the operation's own error; under NCCL also orders this stream after it
        except Exception as exc:
            self.fail(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")

    def fail(self, why: str):
        """Abort the backend (no later wait can hang on it, and NCCL's watchdog has nothing left to time out)
        and raise WeightsGroupError; the group stays failed."""
        self.failed = self.failed or f"weights group rank {self.rank}: {why}"
        self.abort()
        raise WeightsGroupError(self.failed)

    def _check(self) -> None:
        if self.failed:
            raise WeightsGroupError(f"the weights group failed before: {self.failed}")

    def barrier(self, deadline: float | None = None, what: str = "barrier") -> None:
        self._check()
        work = self.backend.allreduce([torch.ones(1, device=self.comm_device)])
        self.finish(work, self.deadline() if deadline is None else deadline, what)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.finish(self.start_broadcast(tensor), self.deadline(), "broadcast")

    def wait_key(self, key: str, stop=None, poll_s: float = 0.05, deadline: float | None = None) -> bytes | None:
        """The value of `key` once set; None if `stop()` becomes true first; past `deadline` (default `timeout_s`
        from now) the group fails with WeightsGroupError."""
        deadline = self.deadline() if deadline is None else deadline
        while not self.store.check([key]):
            if stop is not None and stop():
                return None
            if time.monotonic() > deadline:
                self.fail(f"{key} not set within {self.timeout_s:.0f} s")
            time.sleep(poll_s)
        return self.store.get(key)

    def abort(self) -> None:
        try:
            self.backend.abort()
        except Exception:  # gloo may not implement abort: its pending operations end at their own timeout
            pass

    def close(self) -> None:
        try:
            self.backend.shutdown() if hasattr(self.backend, "shutdown") else None
        except Exception:  # a member that already left: nothing more to release here
            pass


def _str_field(raw: bytes, key: str) -> str:
    value = msgpack.unpackb(raw).get(key)
    if not isinstance(value, str):
        raise WireError(key, f"expected a string, got {type(value).__name__}")
    return value


def visible_index(uuid: str) -> int | None:
    """This process's index of the GPU with this UUID, or None when it cannot see it."""
    if not uuid or not torch.cuda.is_available():
        return None
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    return None


def gpu_uuid(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    return str(torch.cuda.get_device_properties(device).uuid)


def receive(group: Group, ann: Announcement, engine_dtype: torch.dtype, ipc=None) -> list[tuple[str, torch.Tensor]]:
    """A receiver's side of one whole version, collected: every announced tensor (then its aliases) copied out in
    the engine's dtype on this member's device. For tests and small models; an engine loads a version as it
    streams instead (actors.weights.group_buckets.VersionStream), never holding all of it."""
    from actors.weights.group_buckets import VersionStream

    stream = VersionStream(group, ann, engine_dtype, ipc, copies=True)
    try:
        got = list(stream)
    finally:
        stream.drain()
    by_name = dict(got)
    return [(n, by_name[n]) for n, _ in ann.tensors] + [(a, by_name[src]) for a, src in ann.aliases]


def tensor_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
