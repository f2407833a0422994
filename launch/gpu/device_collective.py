"""The weights group's bounded transfer on a device, for `launch.gpu_device_check`: learner rank 0
(actors.weights.group_publisher, in this process) sends versions to a receiver process that loads each as it streams
(actors.weights.group_buckets.VersionStream) into tensors it allocated beforehand, as an engine's weights are.

- `ipc` (CUDA): the receiver on the same GPU, as a colocated vLLM worker: the group must pick CUDA IPC.
- `nccl` (CUDA, two GPUs or more): the receiver sees only the second GPU (CUDA_VISIBLE_DEVICES), as a generator
  actor of a Ray run does, so the group must pick NCCL.
- `gloo` (CPU): the receiver on the CPU, the same broadcast code as `nccl`.

Each must deliver the versions bit for bit (SHA-256 of every tensor's bytes on both sides) and be acked; the
figures are the bucket buffers each side allocated (`BucketBuffers`, the IPC staging bucket) and, on CUDA, each
side's peak GPU memory above what it held before the version (torch.cuda.max_memory_allocated). Needs torch and
msgpack only.
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time
import traceback

import torch

RECEIVER = "replica-0"


def version(seed: int, shapes: list[tuple[str, tuple[int, ...]]], device: torch.device,
            dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(n, torch.randn(s, generator=g).to(device=device, dtype=dtype)) for n, s in shapes]


def model_shapes(layers: int, width: int, ffn: int, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Checkpoint names and shapes of a Llama-like model (SmolLM2-135M: 30, 576, 1536, 49152)."""
    out = [("model.embed_tokens.weight", (vocab, width))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (width, width)), (p + "self_attn.k_proj.weight", (width // 3, width)),
                (p + "self_attn.v_proj.weight", (width // 3, width)), (p + "self_attn.o_proj.weight", (width, width)),
                (p + "mlp.gate_proj.weight", (ffn, width)), (p + "mlp.up_proj.weight", (ffn, width)),
                (p + "mlp.down_proj.weight", (width, ffn)), (p + "input_layernorm.weight", (width,)),
                (p + "post_attention_layernorm.weight", (width,))]
    return out + [("model.norm.weight", (width,))]


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def _receiver(endpoint: str, device: str, shapes, dtype: str, versions: int, out) -> None:
    import torch

    from actors.weights.group_buckets import VersionStream
    from actors.weights.group_subscriber import CollectiveSubscriber
    from actors.weights.group import Group
    from actors.weights.cuda_ipc import Importer

    try:
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        sub = CollectiveSubscriber(endpoint, RECEIVER, timeout_s=120)
        group = Group(sub.host, sub.port, 1, 2, dev, timeout_s=120)
        importer = Importer(group.source_index) if group.ipc else None
        params = {n: torch.empty(s, dtype=getattr(torch, dtype), device=dev) for n, s in shapes}  # the "engine"
        for _ in range(versions):
            seq, _, ann, problem = sub.next(lambda: False)
            if ann is None:
                raise RuntimeError(f"announcement refused: {problem}")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
            stream = VersionStream(group, ann, params[shapes[0][0]].dtype, importer)
            t0 = time.monotonic()
            for name, t in stream:
                params[name].copy_(t)  # as a replaying loader does, before it takes the next tensor
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            seconds = time.monotonic() - t0
            peak = torch.cuda.max_memory_allocated(dev) - before if dev.type == "cuda" else None
            out.put({"version": ann.version, "mode": ann.mode, "backend": group.backend_name, "seconds": seconds,
                     "buffers_allocated": stream.buffers.allocations, "buffer_bytes": stream.buffers.capacity,
                     "buffer_peak_bytes": stream.buffers.peak, "gpu_peak_extra_bytes": peak,
                     "digests": {n: digest(p) for n, p in params.items()}})
            sub.ack(seq, True)
        group.close()
    except BaseException:
        out.put({"error": traceback.format_exc()[-2000:]})


def collective_case(mode: str, shapes, bucket_bytes: int, dtype: str = "bfloat16", versions: int = 2) -> dict:
    """One of ipc, nccl, gloo (see the module's docstring); returns its figures and checks."""
    from actors.weights.group_publisher import CollectivePublisher

    cuda = mode in ("ipc", "nccl")
    rank0 = torch.device("cuda", 0) if cuda else torch.device("cpu")
    wire = getattr(torch, dtype)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    pub = CollectivePublisher("127.0.0.1", 0, [RECEIVER], 1, rank0, dtype, timeout_s=120,
                              bucket_bytes=bucket_bytes)
    # nccl: the receiver sees only GPU 1, as a generator actor of a Ray run sees only its own GPUs
    env = {"CUDA_VISIBLE_DEVICES": "1"} if mode == "nccl" else {"CUDA_VISIBLE_DEVICES": ""} if not cuda else {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        proc = ctx.Process(target=_receiver, args=(pub.endpoint, "cuda:0" if cuda else "cpu", shapes, dtype,
                                                   versions, out), daemon=True)
        proc.start()
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    results, sent_digests, sender = [], [], []
    try:
        pub.wait_for_peers(1, timeout_s=120)
        for k in range(versions):
            sent = version(100 + k, shapes, rank0, wire)
            sent_digests.append({n: digest(t) for n, t in sent})
            if cuda:
                torch.cuda.synchronize(rank0)
                torch.cuda.reset_peak_memory_stats(rank0)
            before = torch.cuda.memory_allocated(rank0) if cuda else 0
            t0 = time.monotonic()
            nbytes = pub.publish_stream(k, shapes, [], (t for _, t in sent))
            seconds = time.monotonic() - t0
            got = out.get(timeout=120)
            if "error" in got:
                raise RuntimeError(f"receiver: {got['error']}")
            acks = pub.wait_acks(k, 60)
            sender.append({"bytes": nbytes, "seconds": seconds, "acked": acks[RECEIVER][0],
                           "gpu_peak_extra_bytes": torch.cuda.max_memory_allocated(rank0) - before if cuda else None})
            results.append(got)
            del sent
    finally:
        pub.close()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    largest = max(torch.empty(0, dtype=wire).element_size() * _numel(s) for _, s in shapes)
    bound = max(bucket_bytes, largest)
    want = "ipc" if mode == "ipc" else "broadcast"
    receivers = [{k: v for k, v in r.items() if k != "digests"} for r in results]
    checks = {
        "mode": all(r["mode"] == want for r in results) and pub.mode == want,
        "backend": all(r["backend"] == ("gloo" if mode in ("ipc", "gloo") else "nccl") for r in results),
        "bit_exact": [r["digests"] for r in results] == sent_digests,
        "acked": all(s["acked"] for s in sender),
        "version_over_4_buckets": sender[0]["bytes"] >= 4 * bucket_bytes,
        "receiver_buffers_within_2": all(r["buffer_peak_bytes"] <= 2 * bound for r in results),
        "sender_buffers_within_2": pub.peak_buffer_bytes <= 2 * bound,
    }
    if cuda:  # what the caching allocator saw: the whole version would be sender[0]["bytes"]
        checks["receiver_gpu_peak_within_2_buffers"] = all(r["gpu_peak_extra_bytes"] <= 2 * bound for r in results)
        checks["sender_gpu_peak_within_2_buffers"] = all(s["gpu_peak_extra_bytes"] <= 2 * bound for s in sender)
    return {"mode": mode, "bucket_bytes": bucket_bytes, "version_bytes": sender[0]["bytes"],
            "sender": sender, "sender_buffer_peak_bytes": pub.peak_buffer_bytes, "receiver": receivers,
            "checks": checks, "passed": all(checks.values())}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
