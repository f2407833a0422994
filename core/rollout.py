"""The multi-turn agent loop: one episode of reset -> generate -> step -> ..., emitted as one `Trajectory`.

What must hold:
- Tokens are append-only: the conversation start is rendered once (`ChatFormat.start`), then sampled tokens,
  closings and user turns are appended. Sampled tokens carry mask 1, their behaviour logprob and version;
  every other token carries mask 0, logprob 0 and version -1.
- The episode ends on the env's done (`done`), on the horizon (`horizon`), when the next turn would not fit in
  `max_context_tokens` (`context_limit`), or on an env failure (`env_error` / `env_timeout`, after which the
  caller must replace the env). The record says which; nothing becomes a silent zero reward.
- The record ends with the closing of the last reply when the episode ends on done or the horizon: an
  observation that no reply follows is not appended.
- Each step awaits the next generation as soon as the env answered: there are no lockstep rounds.
- A reply the generator cut without finishing it (finish reason `abort`: shutdown) is not appended and the
  episode ends `aborted`; the generator's own abort-and-continue on a weight update never surfaces here.
- When the episode ends, however it ends, the policy's optional `end_session` is told (core/policy.py).
- With `resample_repeats` > 0 (evaluation only), a reply the episode already gave to the same observation is
  sampled again, at `resample_temperature`, up to that many times, until one differs: in a deterministic env
  the same reply to the same observation has the same effect, so a greedy policy that got nowhere with it
  would otherwise repeat it until the turn limit. Not for training: the replies it rejects make the behaviour
  policy differ from the one whose logprobs the record holds.
- The format reward is paid only for a turn the env judged valid (`valid_action is True`); a turn whose
  validity the env cannot tell (None) earns none. Metrics count `valid_actions` (accepted) and `judged_turns`
  (turns with a known verdict, accepted or not), so the valid-action fraction covers judged turns only.
  Nor is it paid for an accepted action the env says changed nothing (`StepResult.changed is False`, counted
  in `no_op_turns`), unless `format_reward_no_ops`: a listed no-op such as BabyAI's `check available actions`
  is exactly an action, and paid per turn a policy learned to repeat it until the turn limit. Nor for one that
  took the world back to a state the episode was already in (`StepResult.revisited`, counted in
  `revisit_turns`), when `format_reward_revisits` is off (it is on by default): paid, a `pickup` then `drop`
  of one object earns it every turn of a loop.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from core.chat import ChatFormat
from core.env import Env
from core.policy import END_SESSION, GenerationRequest, GenerationResult, Policy, PolicyLost
from core.trajectory import (
    LOGPROB_DTYPE, MASK_DTYPE, MAX_ACTION_CHARS, NO_VERSION, TOKEN_DTYPE, VERSION_DTYPE, Termination, Trajectory,
)

log = logging.getLogger("agentgym.rollout")


@dataclass(frozen=True)
class EpisodeSpec:
    trajectory_id: str
    item_id: str
    group_id: str
    sample_index: int
    horizon: int  # turn limit in force for this episode
    priority: int = 0  # its group's start order: a generator scheduling by priority serves lower values first


@dataclass(frozen=True)
class EpisodeLimits:
    max_tokens_per_turn: int = 48
    max_context_tokens: int = 2048
    min_tokens_per_turn: int = 0  # the end-of-turn token is held back until a reply has this many tokens
    temperature: float = 1.0
    top_p: float = 1.0
    format_reward: float = 0.0  # added to a turn's reward when the env judged its action valid (not unknown)
    format_reward_on: str = "valid"  # or "clean": only when the reply kept to the format (rule strict or exact)
    format_reward_per: str = "turn"  # or "episode": an episode earns format_reward x its paid turns' share
    format_reward_no_ops: bool = False  # also pay an accepted action the env says changed nothing
    format_reward_revisits: bool = True  # also pay one that returned the world to a state the episode was in
    repeat_penalty: float = 0.0  # taken from a turn whose reply was already given to the same observation
    instruction_role: str = "system"
    resample_repeats: int = 0  # evaluation only: tries at a reply not already given to the same observation
    resample_temperature: float = 1.0
    reset_timeout_s: float = 120.0
    step_timeout_s: float = 60.0


class _Builder:
    """Accumulates the per-token arrays of one episode."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []

    def context(self, ids: list[int]) -> None:
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [NO_VERSION] * len(ids)

    def sampled(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        self.tokens += ids
        self.mask += [1] * len(ids)
        self.logprobs += [min(0.0, float(x)) for x in logprobs]
        self.versions += versions


async def run_episode(env: Env, policy: Policy, chat: ChatFormat, spec: EpisodeSpec,
                      limits: EpisodeLimits) -> Trajectory:
    """Run one episode to its end and return its record (never raises for env or policy failures)."""
    b = _Builder()
    turn_ends: list[int] = []
    turn_rewards: list[float] = []
    turn_actions: list[str] = []  # what the env parsed from each reply, for transcripts (never trained on)
    turn_shaped: list[float] = []  # the format reward inside each entry of turn_rewards
    metrics = {"env_reward": 0.0, "format_reward": 0.0, "valid_actions": 0.0, "judged_turns": 0.0,
               "success": 0.0, "gen_tokens": 0.0, "gen_seconds": 0.0, "env_seconds": 0.0}
    # observation -> the replies (`_said`) given to it so far: resample_repeats, repeat_penalty, repeated_turns
    given: dict[str, set[str]] = {}
    termination = Termination.HORIZON
    started = time.monotonic()
    try:
        t0 = time.monotonic()
        obs = await asyncio.wait_for(env.reset(spec.item_id), limits.reset_timeout_s)
        metrics["env_seconds"] += time.monotonic() - t0
        b.context(chat.start(obs.instruction, obs.text, limits.instruction_role))
        seen = obs.text  # the observation the next reply answers
        for turn in range(spec.horizon):
            closing = len(chat.closing(False))
            room = limits.max_context_tokens - len(b.tokens) - closing
            if room < 1:
                termination = Termination.CONTEXT
                break
            t0 = time.monotonic()
            try:
                request = GenerationRequest(
                    prompt_ids=list(b.tokens), max_tokens=min(limits.max_tokens_per_turn, room),
                    min_tokens=min(limits.min_tokens_per_turn, limits.max_tokens_per_turn, room),
                    session_id=spec.trajectory_id, temperature=limits.temperature, top_p=limits.top_p,
                    item_id=spec.item_id, sample_index=spec.sample_index, priority=spec.priority)
                gen = await policy.generate(request)
                if limits.resample_repeats:
                    gen = await _unrepeated(policy, request, gen, given.setdefault(seen, set()), chat, limits,
                                            metrics)
            except PolicyLost:  # its replica died (logged once by the policy client): regenerated, not trained
                termination = Termination.LOST
                break
            except Exception as exc:  # the generator failed: the run cannot continue this episode
                log.error("episode %s: generation failed: %r", spec.trajectory_id, exc)
                metrics["policy_error"] = 1.0
                termination = Termination.ABORTED
                break
            metrics["gen_seconds"] += time.monotonic() - t0
            if not gen.token_ids or gen.finish_reason == "abort":
                termination = Termination.ABORTED  # the generator is shutting down
                break
            b.sampled(gen.token_ids, gen.logprobs, gen.versions)
            turn_ends.append(len(b.tokens))
            metrics["gen_tokens"] += len(gen.token_ids)
            sampled_eos = gen.finish_reason == "stop" and gen.token_ids[-1] == chat.eos_id
            b.context(chat.closing(sampled_eos))
            reply = chat.tok.decode(gen.token_ids, skip_special_tokens=True)
            t0 = time.monotonic()
            try:
                step = await asyncio.wait_for(env.step(reply), limits.step_timeout_s)
            except asyncio.TimeoutError:
                termination = Termination.ENV_TIMEOUT
                turn_rewards.append(0.0)
                turn_actions.append("")
                break
            except Exception as exc:
                log.warning("episode %s: env %s raised in step: %r", spec.trajectory_id, env.family, exc)
                termination = Termination.ENV_ERROR
                turn_rewards.append(0.0)
                turn_actions.append("")
                break
            finally:
                metrics["env_seconds"] += time.monotonic() - t0
            valid = step.valid_action  # True, False, or None: the env cannot tell
            clean = limits.format_reward_on == "valid" or step.parse_rule in ("strict", "exact")
            no_op = step.changed is False
            revisit = step.revisited is True and not no_op
            paid = (valid is True and clean and (limits.format_reward_no_ops or not no_op)
                    and (limits.format_reward_revisits or not revisit))
            shaped = limits.format_reward if paid else 0.0
            metrics["no_op_turns"] = metrics.get("no_op_turns", 0.0) + float(no_op)
            metrics["revisit_turns"] = metrics.get("revisit_turns", 0.0) + float(revisit)
            penalty = _repeat_penalty(given.setdefault(seen, set()), reply, limits.repeat_penalty, metrics)
            turn_rewards.append(float(step.reward) + shaped - penalty)
            turn_shaped.append(shaped)
            action = step.info.get("action") if isinstance(step.info, dict) else None
            turn_actions.append(action[:MAX_ACTION_CHARS] if isinstance(action, str) else "")
            metrics["env_reward"] += float(step.reward)
            metrics["format_reward"] += shaped
            metrics["valid_actions"] += float(valid is True)
            metrics["judged_turns"] += float(valid is not None)
            if step.score is not None:
                metrics["score"] = float(step.score)
            if step.done:
                metrics["success"] = float(step.success)
                termination = Termination.DONE
                break
            if turn == spec.horizon - 1:
                break  # horizon: no reply would follow this observation, so it is not appended
            seen = step.observation
            user = chat.user_turn(step.observation)
            if len(b.tokens) + len(user) + 1 + closing > limits.max_context_tokens:
                termination = Termination.CONTEXT
                break
            b.context(user)
    except asyncio.TimeoutError:
        termination = Termination.ENV_TIMEOUT  # reset timed out
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("episode %s: env raised in reset: %r", spec.trajectory_id, exc)
        termination = Termination.ENV_ERROR
    finally:
        await _end_session(policy, spec.trajectory_id)
    if limits.format_reward_per == "episode" and turn_shaped:
        _spread_format_reward(turn_rewards, turn_shaped, len(turn_ends), metrics)
    metrics["num_turns"] = float(len(turn_ends))
    metrics["episode_seconds"] = time.monotonic() - started
    return Trajectory(
        trajectory_id=spec.trajectory_id, group_id=spec.group_id, item_id=spec.item_id, env=env.family,
        sample_index=spec.sample_index, horizon=spec.horizon, termination=termination,
        tokens=np.asarray(b.tokens, TOKEN_DTYPE), loss_mask=np.asarray(b.mask, MASK_DTYPE),
        logprobs=np.asarray(b.logprobs, LOGPROB_DTYPE), versions=np.asarray(b.versions, VERSION_DTYPE),
        turn_ends=np.asarray(turn_ends, TOKEN_DTYPE), turn_rewards=np.asarray(turn_rewards, LOGPROB_DTYPE),
        metrics=metrics, turn_actions=turn_actions,
    )


async def _unrepeated(policy: Policy, request: GenerationRequest, gen: GenerationResult, given: set[str],
                      chat: ChatFormat, limits: EpisodeLimits, metrics: dict) -> GenerationResult:
    """`gen`, or when the episode already gave that reply (case and surrounding space aside) to the same
    observation, a new sample at limits.resample_temperature, up to limits.resample_repeats times until one
    differs (the last one is kept either way). Counts the turns resampled and the samples drawn in
    `metrics`. `given` is only read here: the turn's reply joins it once the env took it (`_repeat_penalty`)."""
    def text(g: GenerationResult) -> str:
        return _said(chat.tok.decode(g.token_ids, skip_special_tokens=True))

    again = replace(request, temperature=limits.resample_temperature, top_p=1.0)
    tries, said = 0, text(gen)
    while (said in given and tries < limits.resample_repeats and gen.token_ids
           and gen.finish_reason != "abort"):
        gen = await policy.generate(again)
        tries, said = tries + 1, text(gen)
    if tries:
        metrics["resampled_turns"] = metrics.get("resampled_turns", 0.0) + 1
        metrics["resamples"] = metrics.get("resamples", 0.0) + tries
    return gen


def _said(reply: str) -> str:
    """A reply as repeats are judged: case and surrounding space aside."""
    return reply.strip().lower()


def _repeat_penalty(given: set[str], reply: str, penalty: float, metrics: dict) -> float:
    """`penalty` when `reply` is among the replies already given to this observation (`given`, then updated),
    else 0; counts the repeated turns in `metrics` (penalty or not)."""
    said = _said(reply)
    if said not in given:
        given.add(said)
        return 0.0
    metrics["repeated_turns"] = metrics.get("repeated_turns", 0.0) + 1
    if penalty:
        metrics["repeat_penalty"] = metrics.get("repeat_penalty", 0.0) - penalty
    return penalty


def _spread_format_reward(turn_rewards: list[float], turn_shaped: list[float], turns: int,
                          metrics: dict) -> None:
    """Scale each turn's format reward by 1/turns, so an episode earns at most format_reward in all (paid per
    turn, a longer episode earns more: at a long horizon, stalling on valid actions pays)."""
    for i, shaped in enumerate(turn_shaped):  # turn i's entry (a timed-out last turn has none: it earned 0)
        turn_rewards[i] -= shaped - shaped / turns
    metrics["format_reward"] = sum(turn_shaped) / turns


async def _end_session(policy: Policy, session_id: str) -> None:
    end = getattr(policy, END_SESSION, None)
    if end is None:
        return
    try:
        await end(session_id)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the slot then frees itself when the session goes idle
        log.warning("episode %s: end_session failed: %r", session_id, exc)
