"""A toy multi-turn task with a verifiable reward, and plain torch sampling: the learner's learning tests and
its GPU check (launch.gpu_learner_check) train on it.

Each episode has `turns` turns. Before each reply the env shows a cue word, " left" or " right" (drawn at
random per turn); the agent replies with one token. The reply is correct when its token id lies in the cued
half of the vocabulary (ids below V/2 for left, V/2 and above for right). The reward arrives once, with the
last turn: 1 if every reply was correct, else 0, a sparse final reward over several turns. A uniform policy
scores 2**-turns; to score 0.9 the policy must read each cue and move almost all of its probability mass
into the cued half of a vocabulary of hundreds of tokens, so a rising reward is learning, not luck.

Sampling is plain torch on a copy of the policy (the test is about the learner, not the generator): the whole
batch has the same layout, so each turn is one batched forward with no padding. Behaviour logprobs are those
of the sampling model, and every sampled token carries the version of the weights it was sampled with.
"""
from __future__ import annotations

import numpy as np
import torch

from core.trajectory import Termination, Trajectory

SEPARATOR = " go"  # env text between turns, never sampled
CUES = (" left", " right")


class CueTask:
    def __init__(self, tokenizer, turns: int = 3):
        self.turns = turns
        self.vocab = len(tokenizer)
        self.cue_ids = [self._one_token(tokenizer, c) for c in CUES]
        self.sep_id = self._one_token(tokenizer, SEPARATOR)
        self.start_id = tokenizer.convert_tokens_to_ids("<|im_start|>")

    @staticmethod
    def _one_token(tokenizer, text: str) -> int:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == 1, f"{text!r} is {len(ids)} tokens in this tokenizer"
        return ids[0]

    def correct(self, cue: int, token: np.ndarray) -> np.ndarray:
        """cue 0 (left) wants ids < V/2, cue 1 (right) ids >= V/2."""
        return (token >= self.vocab // 2) == (cue == 1)

    @torch.no_grad()
    def sample(self, model, n_groups: int, group_size: int, version: int, seed: int,
               group_prefix: str = "g") -> list[Trajectory]:
        """Episodes from `model` (a causal LM on CPU), `group_size` per item (an item fixes the cues)."""
        gen = torch.Generator().manual_seed(seed)
        rng = np.random.default_rng(seed)
        b = n_groups * group_size
        cues = np.repeat(rng.integers(0, 2, size=(n_groups, self.turns)), group_size, axis=0)  # [b, turns]
        seq = torch.full((b, 1), self.start_id, dtype=torch.long)
        logprobs = torch.zeros(b, 0)
        replies = []
        for k in range(self.turns):
            env = [self.cue_ids[0], self.cue_ids[1]]
            cue_tok = torch.tensor([env[c] for c in cues[:, k]]).unsqueeze(1)
            prefix = [seq] + ([torch.full((b, 1), self.sep_id)] if k else []) + [cue_tok]
            seq = torch.cat(prefix, dim=1)
            logits = model(input_ids=seq).logits[:, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen)
            replies.append(tok[:, 0].numpy())
            logprobs = torch.cat([logprobs, logp.gather(1, tok)], dim=1)
            seq = torch.cat([seq, tok], dim=1)
        replies = np.stack(replies, axis=1)  # [b, turns]
        success = np.all(self.correct(cues, replies), axis=1)
        tokens = seq.numpy().astype(np.int32)
        n = tokens.shape[1]
        reply_pos = [2 + 3 * k for k in range(self.turns)]  # start, cue, r0, sep, cue, r1, ...
        out = []
        for i in range(b):
            mask = np.zeros(n, np.uint8)
            mask[reply_pos] = 1
            lp = np.zeros(n, np.float32)
            lp[reply_pos] = logprobs[i].numpy()
            versions = np.full(n, -1, np.int32)
            versions[reply_pos] = version
            rewards = np.zeros(self.turns, np.float32)
            rewards[-1] = float(success[i])
            out.append(Trajectory(
                trajectory_id=f"{group_prefix}{seed}-{i}", group_id=f"{group_prefix}{seed}-{i // group_size}",
                item_id=f"item{i // group_size}", env="cue", tokens=tokens[i].copy(), loss_mask=mask,
                logprobs=lp, versions=versions, turn_ends=np.array([p + 1 for p in reply_pos], np.int32),
                turn_rewards=rewards, horizon=self.turns, termination=Termination.DONE,
                sample_index=i % group_size))
        return out


def load_weights(model, tensors: dict) -> None:
    """Copy a received weight set (name -> TensorBytes) into a plain torch model, every tensor required."""
    state = model.state_dict()
    missing = set(state) - set(tensors)
    assert not missing, f"weights missing from the published set: {sorted(missing)[:5]}"
    for name, tb in tensors.items():
        state[name].copy_(tensor_of(tb))


def tensor_of(tb) -> torch.Tensor:
    """A received tensor (TensorBytes) as a torch tensor of its own dtype and shape, in memory of its own."""
    return torch.frombuffer(bytearray(tb.data), dtype=getattr(torch, tb.dtype)).reshape(tb.shape)
