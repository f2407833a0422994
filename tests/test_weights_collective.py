"""The weights group's protocol (actors.weights.group) between two real processes over gloo on 127.0.0.1:
learner rank 0 (CollectivePublisher, in this process) announces and broadcasts; a receiver process joins as rank 1,
reads each announcement through CollectiveSubscriber, receives in the engine's dtype and acks.

Checked: a float32 tensor sent to a bfloat16 engine arrives cast (the wire carries bf16); a tensor sent under two
names (tied embeddings) is broadcast once and arrives under both; two versions in sequence; acks; malformed
announcements are refused, naming the field. The bounded receive (actors.weights.group_buckets): a version four
times the bucket arrives bit-exact while each side holds at most two bucket buffers (counted by the buffers
themselves, and every tensor handed to the loader lies inside one of them); a replica that dies mid-version, or
stalls, fails the version on rank 0 and on the other replica with WeightsGroupError within the timeout.
"""
from __future__ import annotations

import multiprocessing as mp

import msgpack
import pytest
import torch

from actors.weights.group_buckets import plan
from actors.weights.group_publisher import CollectivePublisher
from actors.weights.group import Announcement
from core.trajectory import WireError


def state(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(40, 8, generator=g)  # float32
    return [("model.embed_tokens.weight", embed), ("lm_head.weight", embed),  # tied: the same tensor
            ("model.norm.weight", torch.randn(8, generator=g).to(torch.bfloat16)),
            ("model.layers.0.mlp.up_proj.weight", torch.randn(16, 8, generator=g))]


def receiver(endpoint: str, versions: int, out) -> None:
    import torch

    from actors.weights.group_subscriber import CollectiveSubscriber
    from actors.weights.group import Group, receive

    try:
        sub = CollectiveSubscriber(endpoint, "replica-0", timeout_s=60)
        group = Group(sub.host, sub.port, 1, 2, torch.device("cpu"), timeout_s=60)
        for _ in range(versions):
            seq, _, ann, problem = sub.next(lambda: False)
            got = receive(group, ann, torch.bfloat16)
            out.put((ann.version, ann.mode, [a for a in ann.aliases],
                     {n: (str(t.dtype), t.float().tolist()) for n, t in got}))
            sub.ack(seq, True)
        group.close()
    except BaseException as exc:
        out.put(("error", repr(exc)))


def test_broadcast_casts_to_engine_dtype_and_sends_tied_tensor_once():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    pub = CollectivePublisher("127.0.0.1", 0, ["replica-0"], 1, torch.device("cpu"), "bfloat16", timeout_s=60)
    proc = ctx.Process(target=receiver, args=(pub.endpoint, 2, out), daemon=True)
    proc.start()
    try:
        pub.wait_for_peers(1, timeout_s=60)
        assert pub.mode == "broadcast" and pub.group.backend_name == "gloo"
        for version in (3, 4):
            sent = state(version)
            nbytes = pub.publish(version, sent)
            assert nbytes == 2 * (40 * 8 + 8 + 16 * 8)  # bf16 on the wire, the tied tensor once
            got_version, mode, aliases, got = out.get(timeout=60)
            assert (got_version, mode) == (version, "broadcast")
            assert aliases == [("lm_head.weight", "model.embed_tokens.weight")]
            assert set(got) == {n for n, _ in sent}
            for name, t in sent:
                dtype, values = got[name]
                assert dtype == "torch.bfloat16"
                assert torch.equal(torch.tensor(values), t.to(torch.bfloat16).float()), name
            assert pub.wait_acks(version, timeout_s=30) == {"replica-0": (True, "")}
        with pytest.raises(ValueError, match="not published"):
            pub.wait_acks(99, timeout_s=1)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        pub.close()
    assert proc.exitcode == 0


def test_announcement_round_trip_and_refusals():
    tensors = [("a", (2, 3)), ("b", ()), ("d", (300,))]
    ann = Announcement(7, 2, "bfloat16", "broadcast", tensors, [("c", "a")],
                       plan(tensors, torch.bfloat16, 512), 512)
    assert ann.buckets == [[0, 256], [0]]  # 256-byte aligned; "d" (600 bytes) does not fit the first bucket
    back = Announcement.unpack(ann.pack())
    assert (back.version, back.seq, back.dtype, back.tensors, back.aliases, back.buckets, back.bucket_bytes) == (
        7, 2, "bfloat16", tensors, [("c", "a")], [[0, 256], [0]], 512)

    def bad(**change) -> bytes:
        body = msgpack.unpackb(ann.pack())
        body.update(change)
        return msgpack.packb(body)

    for raw, name in [(b"\xc1", "announcement"), (bad(version=-1), "version"), (bad(dtype="int8"), "dtype"),
                      (bad(mode="tcp"), "mode"), (bad(tensors=[["a", [2, -3]]]), "tensors"),
                      (bad(tensors=[["a", [1]], ["a", [1]]]), "tensors"), (bad(aliases=[["c", "zzz"]]), "aliases"),
                      (bad(mode="ipc", buckets=[]), "buckets"), (bad(buckets=[[0, 256, 512]]), "buckets"),
                      (bad(buckets=[[0, 128], [0]]), "buckets"), (bad(bucket_bytes=0), "bucket_bytes"),
                      (bad(bucket_bytes=1 << 40), "bucket_bytes"), (bad(bucket_bytes="1"), "bucket_bytes")]:
        with pytest.raises(WireError) as err:
            Announcement.unpack(raw)
        assert err.value.field == name


def test_learner_layout_announces_tied_output_layer_as_alias(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from actors.zero_engine import full_weight_layout, iter_full_weights
    from core.token_scorer import TokenScorer, policy_state_names

    scorer = TokenScorer(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))
    named = policy_state_names(scorer)
    specs, aliases = full_weight_layout(named)
    assert ("lm_head.weight", "model.embed_tokens.weight") in aliases
    tensors = list(iter_full_weights(named))  # what rank 0 streams: each distinct tensor once, in order
    assert [tuple(t.shape) for t in tensors] == [shape for _, shape in specs]
    assert len(specs) + len(aliases) == len(named)


def test_collective_sync_off_loopback_needs_allow_insecure():
    from configs.run import TransportConfig

    assert TransportConfig(weights_sync="collective").validate() == []
    problems = TransportConfig(host="10.0.0.5", weights_sync="collective", auth="curve").validate()
    assert [field for field, _ in problems] == ["weights_sync"]
    assert TransportConfig(host="10.0.0.5", weights_sync="collective", allow_insecure=True).validate() == []
