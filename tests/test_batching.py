"""Packing trajectories into micro-batches: layout, token budget, balance, and packed scores that equal
unpacked ones on a real (tiny) model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from core.batching import (
    TrainSample,
    micro_batches,
    pack,
    padding_micro_batch,
    plan_bins,
    shard,
    split,
)
from core.token_scorer import Scores, TokenScorer, policy_state_names
from core.trajectory import Termination, Trajectory


def traj(n: int, sampled: list[int], tid: str = "t", seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    mask = np.zeros(n, np.uint8)
    mask[sampled] = 1
    return Trajectory(trajectory_id=tid, group_id="g", item_id="i", env="toy",
                      tokens=rng.integers(0, 400, n).astype(np.int32), loss_mask=mask,
                      logprobs=np.where(mask, -1.0, 0).astype(np.float32),
                      versions=np.where(mask, 3, -1).astype(np.int32),
                      turn_ends=np.array([max(sampled) + 1], np.int32), turn_rewards=np.ones(1, np.float32),
                      horizon=1, termination=Termination.DONE)


def test_pack_layout():
    a, b = traj(5, [2, 3], "a"), traj(4, [1, 3], "b", seed=1)
    mb = pack([a, b], [0, 1])
    assert mb.input_ids.tolist() == a.tokens.tolist() + b.tokens.tolist()
    assert mb.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert mb.score_index.tolist() == [1, 2, 5, 7]  # position p scores token p + 1 of the row
    assert mb.targets.tolist() == [a.tokens[2], a.tokens[3], b.tokens[1], b.tokens[3]]
    assert mb.token_of.tolist() == [2, 3, 1, 3]
    assert mb.seq_token_count.tolist() == [2, 2, 2, 2]
    assert mb.spans == [(0, 0, 2), (1, 2, 4)]


def test_gather_and_scatter_round_trip():
    trajs = [traj(6, [2, 4, 5], "a"), traj(3, [2], "b"), traj(7, [1, 2, 6], "c")]
    per = [np.arange(t.num_tokens, dtype=np.float32) * (i + 1) for i, t in enumerate(trajs)]
    mb = pack(trajs, [2, 0])
    got = mb.gather(per)
    assert got.tolist() == [3.0, 6.0, 18.0, 2.0, 4.0, 5.0]
    back = [np.zeros(t.num_tokens, np.float32) for t in trajs]
    mb.scatter(got, back)
    assert back[0].tolist() == [0, 0, 2, 0, 4, 5] and back[1].tolist() == [0, 0, 0]
    assert back[2].tolist() == [0, 3, 6, 0, 0, 0, 18]


def test_bins_respect_the_budget_and_keep_long_sequences_whole():
    lengths = [7, 3, 5, 2, 9, 12]
    bins = plan_bins(lengths, budget=10)
    assert sorted(i for b in bins for i in b) == list(range(6))
    for b in bins:
        total = sum(lengths[i] for i in b)
        assert total <= 10 or len(b) == 1  # the 12-token sequence travels alone
    assert [12] in [[lengths[i] for i in b] for b in bins]
    assert len(bins) == 4  # first fit decreasing: [12] [9] [7, 3] [5, 2]
    with pytest.raises(ValueError, match="budget"):
        plan_bins(lengths, 0)


def test_micro_batches_pad_to_the_agreed_count():
    trajs = [traj(6, [3]), traj(6, [4])]
    mbs = micro_batches(trajs, [0, 1], budget=100, at_least=3)
    assert len(mbs) == 3 and [m.padding for m in mbs] == [False, True, True]
    pad = padding_micro_batch()
    assert pad.num_scored == 1 and pad.spans == [] and pad.gather([]).tolist() == [0.0]


def test_shard_and_split_balance_tokens_deterministically():
    samples = [TrainSample(traj(n, [1], f"t{n}")) for n in (10, 9, 8, 4, 3, 2, 2)]
    shards = shard(samples, 2)
    loads = [sum(s.num_tokens for s in sh) for sh in shards]
    assert loads == [19, 19] and sum(len(s) for s in shards) == 7
    assert [[s.trajectory.trajectory_id for s in sh] for sh in shard(samples, 2)] == \
           [[s.trajectory.trajectory_id for s in sh] for sh in shards]
    assert shard(samples[:1], 3)[1:] == [[], []]
    parts = split([5, 6, 7], [1, 1, 1], 2)
    assert sorted(i for p in parts for i in p) == [5, 6, 7]


def test_train_sample_validation():
    t = traj(5, [2, 3])
    TrainSample(t, np.where(t.loss_mask, 0.5, 0).astype(np.float32)).validate()
    with pytest.raises(ValueError, match="0 off sampled"):
        TrainSample(t, np.full(5, 0.5, np.float32)).validate()
    with pytest.raises(ValueError, match="float32 of shape"):
        TrainSample(t, np.zeros(4, np.float32)).validate()
    first = traj(5, [0, 3])
    with pytest.raises(ValueError, match="first token"):
        TrainSample(first).validate()


@pytest.mark.parametrize("attn", ["packed_sdpa", "sdpa"])
def test_packed_scores_equal_unpacked_scores(tiny_model_dir, attn):
    from transformers import AutoModelForCausalLM

    from core.packed_attention import register

    register()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=attn)
    scorer = TokenScorer(model, with_value_head=True, temperature=0.7).eval()
    trajs = [traj(9, [4, 5, 8], "a", 1), traj(14, [3, 4, 5, 11], "b", 2), traj(6, [5], "c", 3)]
    t = torch.from_numpy
    with torch.no_grad():
        packed = Scores.of(scorer(*(t(x) for x in (pack(trajs, [0, 1, 2]).input_ids,
                                                   pack(trajs, [0, 1, 2]).position_ids,
                                                   pack(trajs, [0, 1, 2]).score_index,
                                                   pack(trajs, [0, 1, 2]).targets)), with_entropy=True))
        alone = []
        for i, tr in enumerate(trajs):
            ids = t(tr.tokens.astype(np.int64)).unsqueeze(0)
            logits = model(input_ids=ids, position_ids=torch.arange(ids.shape[1]).unsqueeze(0)).logits[0].float() / 0.7
            lp = torch.log_softmax(logits, -1)
            sampled = np.flatnonzero(tr.loss_mask)
            alone.append(lp[sampled - 1, t(tr.tokens[sampled].astype(np.int64))])
            ent = -(lp.exp() * lp).sum(-1)[sampled - 1]
            n0 = sum(int(x.loss_mask.sum()) for x in trajs[:i])
            assert torch.allclose(packed.entropy[n0:n0 + len(sampled)], ent, atol=1e-5)
    assert torch.allclose(packed.logprobs, torch.cat(alone), atol=1e-5)
    assert packed.values.shape == (8,) and torch.all(packed.values == 0)  # the value head starts at zero
    names = [n for n, _ in policy_state_names(scorer)]
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names  # tied: both names
    assert not any(n.startswith("value_head") for n in names)
