"""The trajectory record: what an env pool sends to the coordinator for one episode.

Invariants (checked by `Trajectory.validate`, which the decoder always calls):
- `tokens`, `loss_mask`, `logprobs` and `versions` have one entry per token, the same length T.
- `loss_mask[t]` is true exactly on tokens the policy sampled. Prompt, template and env tokens are false.
- On sampled tokens the behaviour logprob is finite and <= 0 and the policy version is >= 0; elsewhere the
  logprob is 0.0 and the version is -1 ("no policy produced this token").
- `turn_ends[k]` is one past the last token of the agent's k-th reply; the offsets are strictly increasing and
  lie in [1, T]. `turn_rewards[k]` is the reward the env gave for the action in that reply.
- A non-zero `turn_rewards[k]` has a sampled token before `turn_ends[k]` (the action it is credited to);
  rewards are finite and bounded; token ids lie in the model's vocabulary when the decoder knows its size.
- Tokens are append-only over an episode: the learner trains on exactly these ids and never re-tokenizes text.
- `turn_actions[k]` is the action the env took from the k-th reply ("" when it found none), at most
  MAX_ACTION_CHARS characters; the list is empty (not recorded) or has one entry per turn. It is for people
  reading transcripts only: nothing trains on it.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import numpy as np


class Termination(str, enum.Enum):
    """Why an episode ended."""

    DONE = "done"  # the env said done (success or failure)
    HORIZON = "horizon"  # the turn limit in force was reached
    CONTEXT = "context_limit"  # the next turn would not fit in the context window
    ENV_ERROR = "env_error"  # the env raised; it was closed and replaced
    ENV_TIMEOUT = "env_timeout"  # an env call exceeded its timeout; it was closed and replaced
    ABORTED = "aborted"  # the run stopped (shutdown) before the episode finished
    LOST = "lost"  # the actor running it died; reported by the pool's supervisor


class WireError(ValueError):
    """A record or frame failed validation. `field` names the offending field."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


TOKEN_DTYPE = np.dtype("<i4")
MASK_DTYPE = np.dtype("u1")
LOGPROB_DTYPE = np.dtype("<f4")
VERSION_DTYPE = np.dtype("<i4")
NO_VERSION = -1
MAX_ACTION_CHARS = 256  # a parsed action longer than this is cut (an action is a short phrase)


def _check_array(name: str, arr: object, dtype: np.dtype, length: int | None) -> None:
    if not isinstance(arr, np.ndarray):
        raise WireError(name, f"expected a numpy array, got {type(arr).__name__}")
    if arr.ndim != 1:
        raise WireError(name, f"expected 1-D, got shape {arr.shape}")
    if arr.dtype != dtype:
        raise WireError(name, f"expected dtype {dtype}, got {arr.dtype}")
    if length is not None and arr.shape[0] != length:
        raise WireError(name, f"expected {length} entries, got {arr.shape[0]}")


@dataclass
class Trajectory:
    """One episode, token by token. See the module docstring for what must hold."""

    trajectory_id: str
    group_id: str
    item_id: str
    env: str
    tokens: np.ndarray  # [T] int32 token ids
    loss_mask: np.ndarray  # [T] uint8, 1 on sampled tokens
    logprobs: np.ndarray  # [T] float32 behaviour logprob of each sampled token, 0 elsewhere
    versions: np.ndarray  # [T] int32 policy version that sampled each token, -1 elsewhere
    turn_ends: np.ndarray  # [K] int32 end offset of each agent reply
    turn_rewards: np.ndarray  # [K] float32 reward for each agent action
    horizon: int  # the turn limit in force when the episode ran
    termination: Termination
    sample_index: int = 0  # index of this sample within its group
    metrics: dict[str, float] = field(default_factory=dict)
    turn_actions: list[str] = field(default_factory=list)  # [K] the action the env parsed, "" for none; or []

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_turns(self) -> int:
        return int(self.turn_ends.shape[0])

    @property
    def total_reward(self) -> float:
        return float(self.turn_rewards.sum(dtype=np.float64))

    @property
    def prompt_len(self) -> int:
        """Number of tokens before the first sampled token (all of them if nothing was sampled)."""
        sampled = np.flatnonzero(self.loss_mask)
        return int(sampled[0]) if sampled.size else self.num_tokens

    def oldest_version(self) -> int:
        """The oldest policy version among sampled tokens, or -1 if nothing was sampled."""
        sampled = self.versions[self.loss_mask.astype(bool)]
        return int(sampled.min()) if sampled.size else NO_VERSION

    def validate(self, max_tokens: int = 1 << 22, max_turns: int = 1 << 16, vocab_size: int = 0,
                 max_abs_reward: float = 1e6) -> None:
        """Raise WireError naming the first field that breaks an invariant (`vocab_size` 0: ids unchecked)."""
        for name in ("trajectory_id", "group_id", "item_id", "env"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > 256:
                raise WireError(name, f"expected a non-empty string of at most 256 chars, got {value!r:.80}")
        if not isinstance(self.termination, Termination):
            raise WireError("termination", f"expected a Termination, got {self.termination!r}")
        for name, lo in (("horizon", 1), ("sample_index", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise WireError(name, f"expected an int >= {lo}, got {value!r}")
        _check_array("tokens", self.tokens, TOKEN_DTYPE, None)
        n = self.num_tokens
        if n > max_tokens:
            raise WireError("tokens", f"{n} tokens exceed the limit of {max_tokens}")
        _check_array("loss_mask", self.loss_mask, MASK_DTYPE, n)
        _check_array("logprobs", self.logprobs, LOGPROB_DTYPE, n)
        _check_array("versions", self.versions, VERSION_DTYPE, n)
        _check_array("turn_ends", self.turn_ends, TOKEN_DTYPE, None)
        k = self.num_turns
        if k > max_turns:
            raise WireError("turn_ends", f"{k} turns exceed the limit of {max_turns}")
        _check_array("turn_rewards", self.turn_rewards, LOGPROB_DTYPE, k)
        # Whole-array passes without boolean indexing: validation runs on every received record.
        if n and self.tokens.min() < 0:
            raise WireError("tokens", "token ids must be >= 0")
        if n and vocab_size and self.tokens.max() >= vocab_size:  # would index past the learner's embedding
            raise WireError("tokens", f"token id {int(self.tokens.max())} is outside the vocabulary ({vocab_size})")
        if n and self.loss_mask.max() > 1:
            raise WireError("loss_mask", "entries must be 0 or 1")
        sampled = self.loss_mask.view(np.bool_)
        lp = self.logprobs
        if n and not (np.isfinite(lp).all() and lp.max() <= 0):
            raise WireError("logprobs", "sampled tokens need finite logprobs <= 0")
        if n and np.any((lp != 0) > sampled):  # a non-zero logprob where nothing was sampled
            raise WireError("logprobs", "tokens that were not sampled must carry logprob 0")
        v = self.versions
        if n and (v.min() < NO_VERSION or np.any((v < 0) == sampled)):
            if np.any(v[sampled] < 0):
                raise WireError("versions", "sampled tokens need a policy version >= 0")
            raise WireError("versions", f"tokens that were not sampled must carry version {NO_VERSION}")
        if k:
            # int64 before differencing: int32 offsets such as [1, 2**31 - 1, -2**31 + 1] wrap around in int32.
            ends = self.turn_ends.astype(np.int64)
            if ends[0] < 1 or ends[-1] > n or np.any(np.diff(ends) <= 0):
                raise WireError("turn_ends", f"offsets must be strictly increasing within [1, {n}]")
            rewards = self.turn_rewards
            if not np.all(np.isfinite(rewards)):
                raise WireError("turn_rewards", "rewards must be finite")
            if np.abs(rewards).max() > max_abs_reward:
                raise WireError("turn_rewards", f"a reward exceeds the limit of +-{max_abs_reward:g}")
            # A reward is credited to the last sampled token at or before its turn's end (core.advantages):
            # a reward on a turn that no sampled token precedes cannot be credited to any action.
            rewarded = np.flatnonzero(rewards)
            if rewarded.size:
                first_sampled = int(np.argmax(sampled)) if sampled.any() else n
                if first_sampled >= ends[rewarded[0]]:
                    raise WireError("turn_rewards", f"turn {int(rewarded[0])} carries a reward but no sampled "
                                                    "token precedes its end")
        actions = self.turn_actions
        if not isinstance(actions, list) or len(actions) not in (0, k):
            raise WireError("turn_actions", f"expected a list of 0 or {k} entries, got "
                                            f"{len(actions) if isinstance(actions, list) else type(actions).__name__}")
        for action in actions:
            if not isinstance(action, str) or len(action) > MAX_ACTION_CHARS:
                raise WireError("turn_actions", f"expected strings of at most {MAX_ACTION_CHARS} chars, got "
                                                f"{action!r:.80}")
        if not isinstance(self.metrics, dict) or len(self.metrics) > 256:
            raise WireError("metrics", "expected a dict of at most 256 entries")
        for key, value in self.metrics.items():
            if not isinstance(key, str) or not isinstance(value, (int, float)) or isinstance(value, bool):
                raise WireError("metrics", f"entry {key!r} must map a str to a number")
            if not math.isfinite(value):
                raise WireError("metrics", f"entry {key!r} is not finite")
