"""Step `collective_update` of `launch.gpu_check`: one version through the weights group
(transport.weights_sync=collective) the way a Ray run sends it.

In a Ray run learner rank 0 and each generator replica are separate processes that see disjoint GPUs, so the
group broadcasts with NCCL between two GPUs. This step does the same whenever a GPU is left over by the engine
(`--tp` below the GPU count; `tensor_parallel_size` leaves one by default on two GPUs or more): rank 0 runs in a
process of its own that sees only that GPU (CUDA_VISIBLE_DEVICES), and broadcasts with NCCL. The check's engine
was started seeing every GPU (in a Ray run it sees only its own), so its workers could open rank 0's memory:
rank 0 is told not to offer CUDA IPC there (`allow_ipc=False`). launch.gpu_device_check's `collective_nccl`
shows the choice made from visibility alone.
With one GPU, rank 0 runs on the engine's GPU, as a colocated learner would, and the group must choose CUDA IPC.
On `--device cpu`, rank 0 is a process of its own on gloo. The version must be acked and the fixed tokens'
logprobs must move and match the reference with the new weights (launch.gpu.verdict.checks_of).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import tempfile
import time
import traceback

from launch.gpu.compare import NOISE_SCALE, diff_stats, perturbed_state


def plan(device: str, gpus: int, tp: int) -> dict:
    """Where rank 0 runs and which path the group must take: {"mode", "visible", "rank0"}."""
    if device != "cuda":
        return {"mode": "broadcast", "backend": "gloo", "visible": "", "rank0": "cpu"}
    if gpus > tp:  # the GPU after the engine's, under its physical name in this process's visible list
        listed = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        spare = listed[tp] if listed else str(tp)
        return {"mode": "broadcast", "backend": "nccl", "visible": spare, "rank0": "cuda:0"}
    return {"mode": "ipc", "backend": "gloo", "visible": None, "rank0": "cuda:0"}


def _rank0(state_path: str, device: str, replica: str, workers: int, dtype: str, version: int, out, go,
           allow_ipc: bool) -> None:
    """Learner rank 0 in a process of its own: form the group, publish `version` when told, report the acks."""
    import torch

    from actors.weights.group_publisher import CollectivePublisher

    pub = None
    try:
        dev = torch.device(device)
        state = torch.load(state_path, weights_only=True)
        pub = CollectivePublisher("127.0.0.1", 0, [replica], workers, dev, dtype, timeout_s=120, allow_ipc=allow_ipc)
        out.put(("endpoint", pub.endpoint, pub.world_size))
        pub.wait_for_peers(1, 120)
        go.get(timeout=300)
        named = [(k, v.to(dev)) for k, v in state.items()]
        t0 = time.monotonic()
        sent = pub.publish(version, named)
        seconds = time.monotonic() - t0
        acks = pub.wait_acks(version, 120)
        out.put(("done", {"mode": pub.mode, "backend": pub.group.backend_name, "bytes": sent, "seconds": seconds,
                          "acks": {k: list(v) for k, v in acks.items()}}))
    except BaseException:
        out.put(("error", traceback.format_exc()[-1500:]))
    finally:
        if pub is not None:
            pub.close()


async def collective_update(gen, ref, fixed: list[int], device: str, gpus: int, tp: int, dtype: str) -> dict:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return {"skipped": "no GPU visible: the NCCL and CUDA IPC paths need one"}
    where = plan(device, gpus, tp)
    before = await gen.score(fixed)
    state = perturbed_state(ref.state, seed=3, scale=NOISE_SCALE)
    ref.load(state)
    expected = ref.logprobs(fixed)
    version = gen.version + 1
    workers = tp if device == "cuda" else 1
    if where["visible"] is None:  # one GPU: rank 0 here, on the engine's GPU (CUDA IPC)
        return await _in_process(gen, state, where, workers, dtype, version, before, expected, fixed)
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.pt")
        torch.save(state, path)
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = where["visible"]  # the child sees only its own GPU (or none)
        try:
            proc = ctx.Process(target=_rank0, args=(path, where["rank0"], gen.name, workers, dtype, version, out, go,
                                                    where["backend"] != "nccl"), daemon=True)
            proc.start()
        finally:
            os.environ.pop("CUDA_VISIBLE_DEVICES") if saved is None else os.environ.__setitem__(
                "CUDA_VISIBLE_DEVICES", saved)
        try:
            kind, *msg = await asyncio.to_thread(out.get, True, 180)
            if kind != "endpoint":
                raise RuntimeError(f"learner rank 0 process: {msg[0]}")
            endpoint, world_size = msg
            await gen.join_weights_group(endpoint, 1, world_size, timeout_s=120)
            t0 = time.monotonic()
            go.put(True)
            kind, result = await asyncio.to_thread(out.get, True, 300)
            if kind != "done":
                raise RuntimeError(f"learner rank 0 process: {result}")
        finally:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    result.update(seconds_with_ack=time.monotonic() - t0, expected=where, rank0_device=f"{where['rank0']} "
                  f"(CUDA_VISIBLE_DEVICES={where['visible']!r})", version=version, generator_version=gen.version,
                  moves_logprobs_by=diff_stats([(before, expected)]),
                  fixed_logprobs=diff_stats([(await gen.score(fixed), expected)]))
    result["path_as_planned"] = (result["mode"], result["backend"]) == (where["mode"], where["backend"])
    return result


async def _in_process(gen, state, where, workers, dtype, version, before, expected, fixed) -> dict:
    import torch

    from actors.weights.group_publisher import CollectivePublisher

    dev = torch.device(where["rank0"])
    pub = CollectivePublisher("127.0.0.1", 0, [gen.name], workers, dev, dtype, timeout_s=120)
    try:
        await gen.join_weights_group(pub.endpoint, 1, pub.world_size, timeout_s=120)
        await asyncio.to_thread(pub.wait_for_peers, 1, 120)
        t0 = time.monotonic()
        sent = await asyncio.to_thread(pub.publish, version, [(k, v.to(dev)) for k, v in state.items()])
        acks = await asyncio.to_thread(pub.wait_acks, version, 120)
        result = {"mode": pub.mode, "backend": pub.group.backend_name, "bytes": sent,
                  "seconds_with_ack": time.monotonic() - t0, "acks": {k: list(v) for k, v in acks.items()}}
    finally:
        pub.close()
    result.update(expected=where, rank0_device=str(dev), version=version, generator_version=gen.version,
                  moves_logprobs_by=diff_stats([(before, expected)]),
                  fixed_logprobs=diff_stats([(await gen.score(fixed), expected)]))
    result["path_as_planned"] = (result["mode"], result["backend"]) == (where["mode"], where["backend"])
    return result
