"""The multi-turn agent loop: how episodes end, what the record holds, and that episodes never wait for each other.

Policies here are scripted (core/scripted_policy.py) or thin wrappers around it that fail on purpose: the loop
is under test, not the model. tests/test_generator.py runs the same loop on the vLLM generator.
"""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from core.chat import ChatFormat
from core.env import Env, Observation, StepResult
from core.policy import GenerationRequest, GenerationResult
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from core.scripted_policy import ScriptedPolicy
from core.trajectory import NO_VERSION, Termination


class _Env(Env):
    """Scriptable: done after `done_after` steps, optional per-step delay, optional failures."""

    family = "toy"

    def __init__(self, done_after: int = 100, delay_s: float = 0.0, fail_reset: bool = False,
                 fail_step_at: int = 0, hang_step_at: int = 0, obs_len: int = 1):
        self.done_after, self.delay_s = done_after, delay_s
        self.fail_reset, self.fail_step_at, self.hang_step_at = fail_reset, fail_step_at, hang_step_at
        self.obs_len = obs_len
        self.steps = 0
        self.step_times: list[float] = []

    async def reset(self, item_id: str) -> Observation:
        if self.fail_reset:
            raise RuntimeError("simulator crashed")
        self.steps = 0
        return Observation(text=f"Task {item_id}: go to the red ball.", instruction="Act.")

    async def step(self, text: str) -> StepResult:
        self.steps += 1
        self.step_times.append(time.monotonic())
        if self.steps == self.fail_step_at:
            raise RuntimeError("simulator crashed")
        if self.steps == self.hang_step_at:
            await asyncio.sleep(60)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        done = self.steps >= self.done_after
        return StepResult(observation=" ".join(["wall"] * self.obs_len), reward=0.5 if done else 0.0, done=done,
                          valid_action="go" in text, parse_rule="lenient", success=done)


class _Recording(ScriptedPolicy):
    """Scripted replies, plus a log of end_session calls."""

    def __init__(self, tokenizer, reply="go to red ball 1", **kw):
        super().__init__(tokenizer, lambda conversation: reply, version=3, **kw)
        self.ended: list[str] = []

    async def end_session(self, session_id: str) -> None:
        self.ended.append(session_id)


def _spec(name="e-0", horizon=4):
    return EpisodeSpec(name, "toy_1", "group-1", 0, horizon=horizon)


def _run(env, policy, tok, spec=None, **limits):
    return asyncio.run(run_episode(env, policy, ChatFormat(tok), spec or _spec(), EpisodeLimits(**limits)))


def test_done_episode_record(tiny_tokenizer):
    policy = _Recording(tiny_tokenizer)
    traj = _run(_Env(done_after=2), policy, tiny_tokenizer, format_reward=0.1)
    traj.validate()
    assert traj.termination is Termination.DONE and traj.num_turns == 2
    np.testing.assert_allclose(traj.turn_rewards, [0.1, 0.6])
    assert traj.metrics["success"] == 1.0 and traj.metrics["valid_actions"] == 2.0
    sampled = traj.loss_mask.astype(bool)
    assert np.all(traj.versions[sampled] == 3) and np.all(traj.versions[~sampled] == NO_VERSION)
    assert np.all(traj.logprobs[~sampled] == 0)
    assert traj.tokens[-1] != tiny_tokenizer.eos_token_id  # ends with the closing's "\n" after the reply
    assert policy.ended == ["e-0"]


def test_horizon_ends_without_a_trailing_observation(tiny_tokenizer):
    policy = _Recording(tiny_tokenizer)
    traj = _run(_Env(), policy, tiny_tokenizer)
    assert traj.termination is Termination.HORIZON and traj.num_turns == 4
    # The record ends with the last reply and its closing: no observation that no reply follows.
    tail = tiny_tokenizer.decode(traj.tokens[traj.turn_ends[-1]:].tolist())
    assert tail == "\n"
    assert policy.ended == ["e-0"]


def test_context_limit(tiny_tokenizer):
    policy = _Recording(tiny_tokenizer)
    traj = _run(_Env(obs_len=40), policy, tiny_tokenizer, max_context_tokens=160)
    traj.validate()
    assert traj.termination is Termination.CONTEXT and traj.num_tokens <= 160
    assert policy.ended == ["e-0"]


def test_env_failures_end_the_episode_with_their_reason(tiny_tokenizer):
    policy = _Recording(tiny_tokenizer)
    reset_fail = _run(_Env(fail_reset=True), policy, tiny_tokenizer)
    assert reset_fail.termination is Termination.ENV_ERROR and reset_fail.num_tokens == 0
    step_fail = _run(_Env(fail_step_at=2), policy, tiny_tokenizer)
    step_fail.validate()
    assert step_fail.termination is Termination.ENV_ERROR and step_fail.num_turns == 2
    hang = _run(_Env(hang_step_at=1), policy, tiny_tokenizer, step_timeout_s=0.2)
    assert hang.termination is Termination.ENV_TIMEOUT
    assert policy.ended == ["e-0"] * 3


class _Failing(_Recording):
    def __init__(self, tokenizer, fail_at: int, how: str):
        super().__init__(tokenizer)
        self.fail_at, self.how = fail_at, how

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await super().generate(request)
        if self.calls == self.fail_at:
            if self.how == "raise":
                raise ConnectionError("generator actor died")
            result.finish_reason = "abort"  # the generator shut down mid-reply
        return result


@pytest.mark.parametrize("how", ["raise", "abort"])
def test_generator_failure_or_shutdown_aborts_the_episode(tiny_tokenizer, how):
    policy = _Failing(tiny_tokenizer, fail_at=2, how=how)
    traj = _run(_Env(), policy, tiny_tokenizer)
    traj.validate()
    assert traj.termination is Termination.ABORTED
    assert traj.num_turns == 1  # the cut reply is not in the record
    assert policy.ended == ["e-0"]


def test_episodes_do_not_wait_for_each_other(tiny_tokenizer):
    """A fast env's episode finishes all its turns while a slow env's episode is still on its first."""
    policy = _Recording(tiny_tokenizer)
    chat = ChatFormat(tiny_tokenizer)
    slow, fast = _Env(delay_s=1.0), _Env(delay_s=0.01)

    async def both():
        return await asyncio.gather(
            run_episode(slow, policy, chat, _spec("slow", horizon=3), EpisodeLimits()),
            run_episode(fast, policy, chat, _spec("fast", horizon=6), EpisodeLimits()))

    trajs = asyncio.run(both())
    assert [t.num_turns for t in trajs] == [3, 6]
    assert fast.step_times[-1] < slow.step_times[1]  # all six fast turns before the slow one's second
    assert sorted(policy.ended) == ["fast", "slow"]


class _Requests(_Recording):
    """Records each request's token limits and prompt length."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.limits: list[tuple[int, int]] = []
        self.prompts: list[int] = []
        self.priorities: list[int] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.limits.append((request.min_tokens, request.max_tokens))
        self.priorities.append(request.priority)
        self.prompts.append(len(request.prompt_ids))
        return await super().generate(request)


def test_min_tokens_reach_the_policy_capped_by_the_room_left(tiny_tokenizer):
    roomy = _Requests(tiny_tokenizer)
    _run(_Env(done_after=2), roomy, tiny_tokenizer, max_tokens_per_turn=16, min_tokens_per_turn=16)
    assert roomy.limits == [(16, 16), (16, 16)]
    tight = _Requests(tiny_tokenizer)  # the first turn has 9 tokens of room (the closing tokens aside)
    closing = len(ChatFormat(tiny_tokenizer).closing(False))
    _run(_Env(done_after=2), tight, tiny_tokenizer, max_tokens_per_turn=16, min_tokens_per_turn=12,
         max_context_tokens=roomy.prompts[0] + closing + 9)
    assert tight.limits[0] == (9, 9)
    unset = _Requests(tiny_tokenizer)
    _run(_Env(done_after=2), unset, tiny_tokenizer, max_tokens_per_turn=16)
    assert [lo for lo, _ in unset.limits] == [0, 0]


def _babyai_episode(tokenizer, replies, item_id: str, horizon: int, **limits):
    """One episode of the real BabyAI env (lenient parser, brief prompt); the policy says `replies`."""
    from core.env import run_sync_env
    from environments.babyai.env import BabyAIEnv

    said = iter(replies)
    policy = ScriptedPolicy(tokenizer, lambda conversation: next(said), version=1)
    env = run_sync_env(BabyAIEnv(parse_mode="lenient", prompt="brief"))
    return _run(env, policy, tokenizer, spec=EpisodeSpec("e", item_id, "g", 0, horizon=horizon), **limits)


@pytest.mark.parametrize("on, want", [("valid", [0.1, 0.1, 0.1]), ("clean", [0.0, 0.1, 0.0])])
def test_format_reward_on_clean_pays_only_replies_in_the_format(tiny_tokenizer, on, want):
    """On the real BabyAI env (lenient parser): prose that names an action steps the env under both settings,
    but under `clean` only the reply that is exactly the action earns the format reward."""
    replies = ["I think I should turn left here", "turn right", "maybe turn left again"]
    traj = _babyai_episode(tiny_tokenizer, replies, "babyai_1", 3, format_reward=0.1, format_reward_on=on,
                           format_reward_revisits=True)  # turning back is a revisit
    np.testing.assert_allclose(traj.turn_rewards, want)
    assert traj.metrics["valid_actions"] == 3.0


@pytest.mark.parametrize("no_ops, want", [(False, [0.0, 0.1, 0.0]), (True, [0.1, 0.1, 0.1])])
def test_the_format_reward_does_not_pay_an_action_that_changed_nothing(tiny_tokenizer, no_ops, want):
    """On the real BabyAI env: `check available actions` is exactly a listed action, but it changes nothing
    (every observation lists the actions), so it earns no format reward unless format_reward_no_ops; a turn
    does."""
    replies = ["check available actions", "turn right", "check available actions"]
    traj = _babyai_episode(tiny_tokenizer, replies, "babyai_1", 3, format_reward=0.1,
                           format_reward_on="clean", format_reward_no_ops=no_ops)
    np.testing.assert_allclose(traj.turn_rewards, want)
    assert traj.metrics["valid_actions"] == 3.0 and traj.metrics["no_op_turns"] == 2.0


@pytest.mark.parametrize("revisits, want", [(False, [0.1, 0.1, 0.0, 0.0]), (True, [0.1] * 4)])
def test_the_format_reward_does_not_pay_a_return_to_a_state_already_visited(tiny_tokenizer, revisits, want):
    """On the real BabyAI env: `pickup` then `drop` of one object, twice. The second pickup and drop take the
    world back to states the episode was in, so they earn no format reward unless format_reward_revisits."""
    traj = _babyai_episode(tiny_tokenizer, ["pickup grey key 1", "drop"] * 2, "babyai_0", 4,
                           format_reward=0.1, format_reward_on="clean", format_reward_revisits=revisits)
    np.testing.assert_allclose(traj.turn_rewards, want)
    assert traj.metrics["valid_actions"] == 4.0 and traj.metrics["revisit_turns"] == 2.0
    assert traj.metrics["no_op_turns"] == 0.0


def test_every_turn_of_an_episode_carries_its_groups_priority(tiny_tokenizer):
    policy = _Requests(tiny_tokenizer)
    spec = EpisodeSpec("e-7", "toy_1", "group-7", 0, horizon=3, priority=7)
    _run(_Env(), policy, tiny_tokenizer, spec=spec)
    assert policy.priorities == [7, 7, 7]


@pytest.mark.parametrize("horizon", [2, 6])
def test_format_reward_per_episode_does_not_grow_with_the_episode(tiny_tokenizer, horizon):
    """On the real BabyAI env: a policy that only turns right (a valid action that never ends the episode)
    earns format_reward per turn under `turn`, so six turns pay three times two; under `episode` its total is
    format_reward at any length, split over its turns."""
    totals = {}
    for per in ("turn", "episode"):
        # format_reward_revisits: the fourth turn right faces where the first started
        traj = _babyai_episode(tiny_tokenizer, ["turn right"] * horizon, "babyai_1", horizon,
                               format_reward=0.1, format_reward_on="clean", format_reward_per=per,
                               format_reward_revisits=True)
        assert traj.num_turns == horizon and traj.metrics["env_reward"] == 0.0
        totals[per] = float(np.sum(traj.turn_rewards))
        assert traj.metrics["format_reward"] == pytest.approx(totals[per])
        np.testing.assert_allclose(traj.turn_rewards, [totals[per] / horizon] * horizon, rtol=1e-6)
    assert totals == pytest.approx({"turn": 0.1 * horizon, "episode": 0.1})


class _GreedyLoop(ScriptedPolicy):
    """Greedy (temperature 0) it always says `stuck`; sampled, it says the next of `sampled` in turn."""

    def __init__(self, tokenizer, sampled: list[str]):
        self.sampled = list(sampled)
        self.temperatures: list[float] = []
        super().__init__(tokenizer, self._choose)

    def _choose(self, conversation: str) -> str:
        t = self.temperatures[-1]
        return "stuck" if t == 0 else self.sampled.pop(0)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.temperatures.append(request.temperature)
        return await super().generate(request)


class _Wall(Env):
    """`go` wins; anything else leaves the observation as it was (a no-op, as a repeated BabyAI `drop` is)."""

    family = "toy"

    async def reset(self, item_id: str) -> Observation:
        return Observation(text="a wall ahead", instruction="Act.")

    async def step(self, text: str) -> StepResult:
        won = text.strip() == "go"
        return StepResult(observation="a wall ahead", reward=1.0 if won else 0.0, done=won, valid_action=None,
                          parse_rule="", success=won)


def test_a_greedy_repeat_at_the_same_observation_is_sampled_again(tiny_tokenizer):
    """Off (the default), the greedy policy says `stuck` to the same observation until the turn limit. On,
    its second `stuck` there is sampled again at resample_temperature until the reply differs (`STUCK ` is
    the same reply: case and space aside), and the episode goes on to win."""
    off = _run(_Wall(), _GreedyLoop(tiny_tokenizer, []), tiny_tokenizer, _spec(horizon=6), temperature=0.0)
    assert off.termination is Termination.HORIZON and off.metrics["success"] == 0.0
    assert "resampled_turns" not in off.metrics

    policy = _GreedyLoop(tiny_tokenizer, ["STUCK ", "go"])
    on = _run(_Wall(), policy, tiny_tokenizer, _spec(horizon=6), temperature=0.0, resample_repeats=3,
              resample_temperature=0.7)
    assert on.termination is Termination.DONE and on.metrics["success"] == 1.0 and on.num_turns == 2
    assert policy.temperatures == [0.0, 0.0, 0.7, 0.7]
    assert on.metrics["resampled_turns"] == 1.0 and on.metrics["resamples"] == 2.0


def test_resampling_stops_after_its_tries_and_keeps_the_last_reply(tiny_tokenizer):
    policy = _GreedyLoop(tiny_tokenizer, ["stuck"] * 2 + ["stuck"] * 2)
    traj = _run(_Wall(), policy, tiny_tokenizer, _spec(horizon=3), temperature=0.0, resample_repeats=2)
    assert traj.termination is Termination.HORIZON and traj.num_turns == 3
    assert policy.temperatures == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert traj.metrics["resampled_turns"] == 2.0 and traj.metrics["resamples"] == 4.0


def test_the_random_policy_is_never_resampled():
    from configs.load import load_config
    from launch.eval.runner import eval_limits

    cfg = load_config("configs/default.yaml", ["eval.resample_repeats=4", "eval.resample_temperature=0.5"])
    assert eval_limits(cfg).resample_repeats == 4 and eval_limits(cfg).resample_temperature == 0.5
    assert eval_limits(cfg, random_policy=True).resample_repeats == 0


def test_a_reply_repeated_to_the_same_observation_costs_the_repeat_penalty(tiny_tokenizer):
    """A loop (the same reply to an observation that did not change) is penalised from its second time on,
    `STUCK ` counting as `stuck`; a new reply is not; off by default; evaluations never shape rewards."""
    script = ["stuck", "stuck", "STUCK ", "other", "go"]

    def replies():
        said = iter(script)
        return ScriptedPolicy(tiny_tokenizer, lambda conversation: next(said), version=1)

    on = _run(_Wall(), replies(), tiny_tokenizer, _spec(horizon=6), repeat_penalty=0.05)
    assert on.termination is Termination.DONE and on.num_turns == 5
    np.testing.assert_allclose(on.turn_rewards, [0.0, -0.05, -0.05, 0.0, 1.0], rtol=1e-6)
    assert on.metrics["repeated_turns"] == 2.0 and on.metrics["repeat_penalty"] == pytest.approx(-0.1)
    off = _run(_Wall(), replies(), tiny_tokenizer, _spec(horizon=6))
    np.testing.assert_allclose(off.turn_rewards, [0.0, 0.0, 0.0, 0.0, 1.0])
    assert off.metrics["repeated_turns"] == 2.0 and "repeat_penalty" not in off.metrics  # counted all the same
    from core.metrics import rollout_metrics

    assert rollout_metrics([on, off])["rollout/repeated_turn_frac"] == pytest.approx(4 / 10)
    from configs.load import load_config
    from launch.eval.runner import eval_limits

    assert eval_limits(load_config("configs/default.yaml", ["rollout.repeat_penalty=0.05"])).repeat_penalty == 0.0


def test_the_same_reply_to_a_new_observation_is_no_repeat_until_that_observation_comes_again(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, lambda conversation: "go to red ball 1", version=1)
    traj = _run(_Env(done_after=3), policy, tiny_tokenizer, repeat_penalty=0.05)  # observations: task, wall, wall
    np.testing.assert_allclose(traj.turn_rewards, [0.0, 0.0, 0.45], rtol=1e-6)  # the third answers `wall` again
    assert traj.metrics["repeated_turns"] == 1.0
