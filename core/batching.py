"""From trajectories to the learner's packed micro-batches.

What must hold:
- A `TrainSample` is one trajectory plus its per-token advantages (None when the learner computes them itself,
  as for GAE); `validate` checks shapes and that advantages are zero off the sampled tokens.
- Packing is padding-free: the sequences of a micro-batch are laid end to end in one row, with position ids
  restarting at 0 for each, so that an attention implementation that reads packed position ids (SDPA and
  flash-attention in transformers) keeps them apart. A sequence is never split. A micro-batch holds at most
  `budget` tokens, except that a sequence longer than the budget travels alone.
- The per-token arrays of a micro-batch are over its *scored* positions: the row positions whose logits
  predict a sampled token. Position p scores token p+1 of the row, so the first token of a sequence is never
  scored (`TrainSample.validate` refuses a record whose first token is marked sampled: a reply follows a
  prompt).
- `shard` and `split` balance by tokens (largest first onto the lightest bin) and are deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from core.trajectory import Trajectory


@dataclass
class TrainSample:
    """A trajectory with its advantages [T] float32 (None: computed by the learner, e.g. GAE)."""

    trajectory: Trajectory
    advantages: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return self.trajectory.num_tokens

    def validate(self) -> None:
        t = self.trajectory
        t.validate()
        if t.num_tokens and t.loss_mask[0]:
            raise ValueError(f"trajectory {t.trajectory_id}: its first token is marked sampled; a sampled "
                             f"token needs a prefix to be scored from")
        if self.advantages is None:
            return
        a = self.advantages
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != (t.num_tokens,):
            got = f"{getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}"
            raise ValueError(f"trajectory {t.trajectory_id}: advantages must be float32 of shape "
                             f"({t.num_tokens},), got {got}")
        if not np.all(np.isfinite(a)) or np.any(a[t.loss_mask == 0] != 0):
            raise ValueError(f"trajectory {t.trajectory_id}: advantages must be finite and 0 off sampled "
                             f"tokens")


@dataclass
class MicroBatch:
    """One packed row and the per-token arrays of its scored positions (all numpy; the learner converts)."""

    input_ids: np.ndarray  # [L] int64
    position_ids: np.ndarray  # [L] int64, restarting at 0 per sequence
    score_index: np.ndarray  # [n] int64, row positions whose logits score a sampled token
    targets: np.ndarray  # [n] int64, the sampled token each scored position predicts
    token_of: np.ndarray  # [n] int64, index of the scored token within its trajectory
    seq_token_count: np.ndarray  # [n] float32, sampled tokens in the scored token's sequence
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (sample index, start, end) into [n]
    padding: bool = False  # a stand-in that only keeps collectives in step: nothing in it counts

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_scored(self) -> int:
        return int(self.score_index.shape[0])

    @property
    def samples(self) -> list[int]:
        return [m for m, _, _ in self.spans]

    def gather(self, per_sample: Sequence[np.ndarray]) -> np.ndarray:
        """This micro-batch's scored entries of per-trajectory arrays [T_i] (e.g. advantages): float32 [n]."""
        out = np.zeros(self.num_scored, dtype=np.float32)
        for m, a, b in self.spans:
            out[a:b] = per_sample[m][self.token_of[a:b]]
        return out

    def scatter(self, values: np.ndarray, per_sample: Sequence[np.ndarray]) -> None:
        """Write scored entries [n] back into per-trajectory arrays [T_i] (the inverse of `gather`)."""
        for m, a, b in self.spans:
            per_sample[m][self.token_of[a:b]] = values[a:b]


def _lpt(sizes: Sequence[int], n_bins: int) -> list[list[int]]:
    """Longest-processing-time first: the largest item onto the lightest bin; bins keep input order."""
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    load = [0] * n_bins
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        b = min(range(n_bins), key=lambda j: (load[j], j))
        bins[b].append(i)
        load[b] += sizes[i]
    return [sorted(b) for b in bins]


def shard(samples: Sequence[TrainSample], n_ranks: int) -> list[list[TrainSample]]:
    """Split a batch over data-parallel ranks, balanced by tokens. A rank may get none if samples are few."""
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    return [[samples[i] for i in b] for b in _lpt([s.num_tokens for s in samples], n_ranks)]


def split(indices: Sequence[int], sizes: Sequence[int], n_parts: int) -> list[list[int]]:
    """Split `indices` (with token counts `sizes`) into `n_parts` mini-batches balanced by tokens."""
    return [[indices[i] for i in b] for b in _lpt(list(sizes), n_parts)]


def plan_bins(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """First-fit decreasing: group sequence indices into bins of at most `budget` tokens (an over-long
    sequence gets a bin of its own). Bins come out ordered by their first member."""
    if budget < 1:
        raise ValueError(f"micro-batch token budget must be >= 1, got {budget}")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def pack(trajs: Sequence[Trajectory], members: Sequence[int]) -> MicroBatch:
    """Lay the trajectories `members` (indices into `trajs`) end to end in one row."""
    ids, pos, score, tgt, t_of, count, spans = [], [], [], [], [], [], []
    offset = scored = 0
    for m in members:
        t = trajs[m]
        n = t.num_tokens
        ids.append(t.tokens.astype(np.int64))
        pos.append(np.arange(n, dtype=np.int64))
        sampled = np.flatnonzero(t.loss_mask).astype(np.int64)
        score.append(offset + sampled - 1)
        tgt.append(t.tokens[sampled].astype(np.int64))
        t_of.append(sampled)
        count.append(np.full(sampled.size, sampled.size, dtype=np.float32))
        spans.append((m, scored, scored + sampled.size))
        offset += n
        scored += sampled.size

    def cat(xs: list, dtype: type) -> np.ndarray:
        return np.concatenate(xs) if xs else np.zeros(0, dtype=dtype)

    return MicroBatch(input_ids=cat(ids, np.int64), position_ids=cat(pos, np.int64),
                      score_index=cat(score, np.int64), targets=cat(tgt, np.int64),
                      token_of=cat(t_of, np.int64), seq_token_count=cat(count, np.float32), spans=spans)


def padding_micro_batch(token_id: int = 0) -> MicroBatch:
    """A stand-in for a rank that has run out of data while others have not: two tokens, one scored, so that
    it runs the same forward and backward (ZeRO's collectives line up); its tokens carry no loss weight."""
    one = np.ones(1, dtype=np.int64)
    return MicroBatch(input_ids=np.full(2, token_id, dtype=np.int64),
                      position_ids=np.arange(2, dtype=np.int64),
                      score_index=0 * one, targets=token_id * one, token_of=one,
                      seq_token_count=np.ones(1, dtype=np.float32), spans=[], padding=True)


def micro_batches(trajs: Sequence[Trajectory], members: Sequence[int], budget: int,
                  at_least: int = 0) -> list[MicroBatch]:
    """Pack `members` into micro-batches of at most `budget` tokens, then append padding micro-batches until
    there are `at_least` (ranks agree on a count so that their collectives line up)."""
    lengths = [trajs[m].num_tokens for m in members]
    out = [pack(trajs, [members[i] for i in b]) for b in plan_bins(lengths, budget)]
    while len(out) < at_least:
        out.append(padding_micro_batch())
    return out


def count_micro_batches(trajs: Sequence[Trajectory], members: Sequence[int], budget: int) -> int:
    return len(plan_bins([trajs[m].num_tokens for m in members], budget))
