"""The weight update timed as a run pays it: from a learner's ZeRO-3 shards to the replica's ack.

`weight_sync_over_memcpy_from_shards` (launch.bench generator): a DeepSpeed ZeRO-3 engine (one rank on gloo,
in the bench's process) holds the model's parameters partitioned as a ZeRO-3 learner does. Each timed update
gathers them on the learner's own path (`actors.zero_engine.gather_full_weights`: every tensor gathered and
copied once to host bytes), casts them to the generator's dtype where the learner's float32 differs (the bench's
`--dtype bfloat16`; no cast at float32, as in a run whose generator is float32 too), publishes them on the
weights channel and waits for the replica's ack. The clock starts before the gather, so nothing a real update
pays is outside it. The memcpy it is compared with copies the published bytes once (the best of 4 copies).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np


def shard_engine(model_dir: Path):
    """(checkpoint name, tensor) of a ZeRO-3-partitioned float32 copy of the model, as a learner rank holds it."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from actors import zero_engine

    listener = zero_engine.listen_socket("127.0.0.1")
    zero_engine.init_process_group(0, 1, "127.0.0.1", listener.getsockname()[1], use_gpu=False, listener=listener)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    named = list(model.named_parameters(remove_duplicate=False))  # the names before ZeRO partitions anything
    persistent = set(model.state_dict())
    named += [(n, b) for n, b in model.named_buffers(remove_duplicate=False) if n in persistent]
    engine, *_ = deepspeed.initialize(model=model, config=zero_engine.inference_config(3, "float32"))
    if not any(hasattr(t, "ds_id") for _, t in named):
        raise RuntimeError("the ZeRO-3 engine partitioned no parameter: the timing would skip the gather")
    return engine, named


def cast(tensors, dtype: str):
    """The generator's dtype, from the learner's float32 (a copy per tensor; none when they agree)."""
    import torch

    from core.weights.tensors import TensorBytes

    if dtype == "float32":
        return tensors
    target = getattr(torch, dtype)
    out = []
    for t in tensors:
        if t.dtype != "float32":
            out.append(t)
            continue
        low = torch.frombuffer(bytearray(t.data), dtype=torch.float32).to(target)
        out.append(TensorBytes(t.name, dtype, t.shape, memoryview(low.view(torch.uint8).numpy())))
    return out


def weight_sync_from_shards(publisher, handle, model_dir: Path, dtype: str, reps: int, version: int) -> dict:
    """Median seconds of `reps` updates from the shards to the ack, beside memcpy of the published bytes."""
    import os

    import torch.distributed as dist

    from actors import zero_engine

    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    try:
        engine, named = shard_engine(model_dir)
        return _timed(publisher, engine, named, dtype, reps, version)
    finally:  # the bench's offline engine, later in this process, sets up its own group
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _timed(publisher, engine, named, dtype: str, reps: int, version: int) -> dict:
    from actors import zero_engine

    seconds, gathers = [], []
    nbytes, tensors = 0, []
    for _ in range(reps):
        version += 1
        t0 = time.perf_counter()
        tensors = cast(zero_engine.gather_full_weights(named, 0), dtype)
        gathers.append(time.perf_counter() - t0)
        publisher.publish(version, tensors)
        acks = publisher.wait_acks(version, timeout_s=600)
        seconds.append(time.perf_counter() - t0)
        if not acks or not all(ok for ok, _ in acks.values()):
            raise RuntimeError(f"weights version {version} from the shards refused: {acks}")
    nbytes = sum(memoryview(t.data).nbytes for t in tensors)
    src = np.frombuffer(b"".join(bytes(t.data) for t in tensors), np.uint8)
    dst = np.empty_like(src)
    copies = []
    for _ in range(4):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - t0)
    memcpy = min(copies)
    return {"weight_sync_from_shards_s": statistics.median(seconds),
            "weight_gather_cast_s": statistics.median(gathers), "weight_bytes_from_shards": float(nbytes),
            "memcpy_from_shards_s": memcpy,
            "weight_sync_over_memcpy_from_shards": statistics.median(seconds) / memcpy, "version": version}
