"""DeepSpeed plumbing for the learner: process group, ZeRO engine, collectives on small values, full weights.

What must hold:
- The process group uses gloo on CPU and NCCL on GPU, rendezvous by TCP at an address the launcher chose.
  Neither the store nor gloo or NCCL is authenticated: whoever reaches the address can read, overwrite and
  delete the store's keys, so the launcher keeps every rank on one node, meeting on 127.0.0.1, unless
  transport.allow_insecure lets them spread (launch.job.learners, launch.job.roles.learners_span_nodes).
- Gradient accumulation is the caller's: the engine runs with `managed_gradient_accumulation` off, so each
  `engine.step()` applies the gradients of every backward since the previous one, however many there were.
  Gradients are not scaled by an accumulation count; DeepSpeed averages them over the data-parallel ranks.
- `gather_full_weights` is collective (every rank calls it): under ZeRO-3 each parameter is partitioned and
  is gathered with `GatheredParameters`; the copy is taken on rank 0 only, as raw bytes.
"""
from __future__ import annotations

import datetime
import os
import socket
import warnings
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from core.weights.tensors import TensorBytes


def listen_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on `host` alone (the rendezvous store serves on it; torch's own would listen on
    every interface)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int, use_gpu: bool,
                       timeout_s: float = 600.0, listener: socket.socket | None = None) -> torch.device:
    """Join the learners' process group; returns this rank's device. Rank 0 serves the rendezvous store on
    `listener` (bound to the advertised address by `listen_socket`); the others connect to it."""
    import deepspeed  # not at the top: whoever imports the Learner class (the driver) needs no DeepSpeed

    # DeepSpeed's ZeRO collectives call torch APIs that warn on every call in this torch version.
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r".*torch\.distributed\.\w+` is deprecated")
    # DeepSpeed reads these even when given an init_method; a Ray actor sees only its own GPU as device 0.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                      MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    if use_gpu:
        torch.cuda.set_device(0)
    timeout = datetime.timedelta(seconds=timeout_s)
    backend = "nccl" if use_gpu else "gloo"
    if rank == 0 and listener is None:
        raise ValueError("rank 0 needs the listening socket of the rendezvous (listen_socket)")
    store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout, wait_for_workers=False,
                          master_listen_fd=listener.fileno() if rank == 0 else None)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    # DeepSpeed adopts the initialised group (it only wraps it).
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, rank=rank, world_size=world_size,
                               timeout=timeout, verbose=False)
    return torch.device("cuda", 0) if use_gpu else torch.device("cpu")


def deepspeed_config(zero_stage: int, dtype: str, grad_clip: float) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,  # the learner decides where an optimizer step falls
        "gradient_clipping": float(grad_clip),
        "zero_optimization": {"stage": zero_stage},
        "bf16": {"enabled": dtype == "bfloat16"},
        # Gradients of a bfloat16 model add up over micro-batches in float32, not in bfloat16 (8-bit mantissa):
        # on an H200, a bfloat16 ZeRO-3 learner that summed in bfloat16 collapsed on the cue task of
        # launch.gpu_learner_check (reward 0.83 -> 0.06 after one update); summed in float32, it learned.
        "data_types": {"grad_accum_dtype": "fp32"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def inference_config(zero_stage: int, dtype: str) -> dict:
    """For a frozen model: partitioned like the policy under ZeRO-3, a plain replica otherwise."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3 if zero_stage == 3 else 0},
        "bf16": {"enabled": dtype == "bfloat16"},
        "steps_per_print": 1 << 30,
    }


def all_reduce(values: Sequence[float], op: str, device: torch.device) -> list[float]:
    """Sum or max of a few numbers over the learners' group (every rank must call it)."""
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.cpu().tolist()


def _is_partitioned(t: torch.Tensor) -> bool:
    return hasattr(t, "ds_id")


def _as_bytes(t: torch.Tensor) -> tuple[str, tuple[int, ...], memoryview]:
    # One copy to host memory, from a GPU or a CPU tensor alike (the parameter changes at the next step, so a
    # CPU tensor is copied too); `.to("cpu").clone()` would copy a GPU tensor twice.
    cpu = t.detach().to("cpu", copy=True).contiguous()
    raw = cpu.reshape(-1).view(torch.uint8).numpy()
    return str(cpu.dtype).removeprefix("torch."), tuple(cpu.shape), memoryview(raw)


def full_weight_layout(named: Sequence[tuple[str, torch.Tensor]]
                       ) -> tuple[list[tuple[str, tuple[int, ...]]], list[tuple[str, str]]]:
    """(name, full shape) of each distinct tensor of `named`, in order, and (name, first name) of every further
    name of a tensor listed twice (tied embeddings): what `iter_full_weights` yields, announced in advance."""
    specs, aliases, first = [], [], {}
    for name, tensor in named:
        if id(tensor) in first:
            aliases.append((name, first[id(tensor)]))
            continue
        first[id(tensor)] = name
        specs.append((name, tuple(tensor.ds_shape) if _is_partitioned(tensor) else tuple(tensor.shape)))
    return specs, aliases


def iter_full_weights(named: Sequence[tuple[str, torch.Tensor]]) -> Iterator[torch.Tensor]:
    """Each distinct tensor of `named`, full, on this rank's device, valid until the next one is asked for (a
    ZeRO-3 parameter is gathered only meanwhile). Collective in the same order as `gather_full_weights`, so rank 0
    can stream while the other ranks gather."""
    seen: set[int] = set()
    for _, tensor in named:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if _is_partitioned(tensor):
            import deepspeed

            with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
                yield tensor.data
        else:
            yield tensor.data


def gather_full_weights(named: Sequence[tuple[str, torch.Tensor]], rank: int) -> list[TensorBytes]:
    """Full copies of `named` tensors as raw bytes on rank 0 ([] on other ranks). A tensor listed under
    several names (tied embeddings) is gathered once and emitted under each name."""
    import deepspeed

    out: list[TensorBytes] = []
    done: dict[int, tuple[str, tuple[int, ...], memoryview]] = {}
    for name, tensor in named:
        key = id(tensor)
        if key not in done:
            if _is_partitioned(tensor):
                with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
                    done[key] = _as_bytes(tensor.data) if rank == 0 else ("", (), memoryview(b""))
            else:
                done[key] = _as_bytes(tensor.data) if rank == 0 else ("", (), memoryview(b""))
        if rank == 0:
            dtype, shape, data = done[key]
            out.append(TensorBytes(name, dtype, shape, data))
    return out
