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
                                     "aliases": [[name, source name], ...], "buckets": [...]}
  each replica  `ack/<seq>/<name>`  {"ok", "error"}
Data: `mode` "broadcast": one broadcast per tensor, in the announced order, in the announced (wire) dtype;
"ipc": rank 0 copies tensors into a staging bucket and announces its CUDA IPC handle (actors.weights_ipc); the
workers copy out, and one all-reduce per bucket says every worker is done with it.

What must hold:
- Names, dtype and shapes are announced before any data, so a receiver allocates exactly what arrives. The wire
  dtype is the engine's (`model.dtype`): rank 0 casts, a receiver casts again only if its engine differs.
- A tensor sent under two names (tied embeddings) is broadcast once and announced as an alias.
- A receiver that refuses a version still takes part in every broadcast (and drops the data): a member that
  left the sequence would hang the others until the group's timeout.
- Every member must take part in every version: a dead member fails the update within `timeout_s` (named), and
  the run's failure handling rebuilds its roles; the group is not re-formed around it.
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


@dataclass
class Announcement:
    """One version's index. `tensors` in broadcast order; `buckets`: per IPC bucket, the tensors' byte offsets."""

    version: int
    seq: int  # this group's count of announcements before this one (names the IPC keys)
    dtype: str
    mode: str  # broadcast or ipc
    tensors: list[tuple[str, tuple[int, ...]]]
    aliases: list[tuple[str, str]] = field(default_factory=list)
    buckets: list[list[int]] = field(default_factory=list)  # ipc: bucket b holds tensors offsets[b] (bytes)

    def pack(self) -> bytes:
        return msgpack.packb({"version": self.version, "seq": self.seq, "dtype": self.dtype, "mode": self.mode,
                              "tensors": [[n, list(s)] for n, s in self.tensors],
                              "aliases": [list(a) for a in self.aliases], "buckets": self.buckets})

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
        buckets = body.get("buckets") or []
        if mode == "ipc" and sum(len(b) for b in buckets) != len(tensors):
            raise WireError("buckets", "the IPC buckets do not place every tensor")
        if not all(isinstance(b, list) and all(isinstance(o, int) and o >= 0 for o in b) for b in buckets):
            raise WireError("buckets", "expected lists of byte offsets")
        return cls(version, body["seq"], dtype, mode, tensors, aliases, buckets)


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
        if self.backend_name == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.backend = dist.ProcessGroupNCCL(data, rank, world_size, options)
        else:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address(host, port))]
            self.backend = dist.ProcessGroupGloo(data, rank, world_size, options)
        self.barrier()  # the group is formed when every member has joined

    def barrier(self) -> None:
        self.all_reduce(torch.ones(1, device=self.comm_device))

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.backend.broadcast([tensor], opts).wait()

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self.backend.allreduce([tensor]).wait()

    def wait_key(self, key: str, stop=None, poll_s: float = 0.05) -> bytes | None:
        """The value of `key` once set; None if `stop()` becomes true first, TimeoutError past `timeout_s`."""
        deadline = time.monotonic() + self.timeout_s
        while not self.store.check([key]):
            if stop is not None and stop():
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights group rank {self.rank}: {key} not set within {self.timeout_s:.0f} s")
            time.sleep(poll_s)
        return self.store.get(key)

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


def to_wire(t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return t.detach().to(device=device, dtype=dtype).contiguous()


def receive(group: Group, ann: Announcement, engine_dtype: torch.dtype, ipc=None) -> list[tuple[str, torch.Tensor]]:
    """A receiver's side of one version: every announced tensor (then its aliases), in the engine's dtype on this
    member's device. `ipc`: an actors.weights_ipc.Importer when the announcement's mode is ipc."""
    wire = torch_dtype(ann.dtype)
    if ann.mode == "ipc":
        if ipc is None:
            raise RuntimeError("an IPC version reached a member that cannot open IPC handles")
        received = ipc.receive(group, ann)
    else:
        received = []
        for name, shape in ann.tensors:
            buf = torch.empty(shape, dtype=wire, device=group.device)
            group.broadcast(buf)
            received.append((name, buf))
    out = [(n, t if t.dtype == engine_dtype else t.to(engine_dtype)) for n, t in received]
    by_name = dict(out)
    return out + [(alias, by_name[source]) for alias, source in ann.aliases]


def tensor_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
