"""Weights are published without the learner waiting for the generators' acks: the next version waits for
them, a failure in them stops the run, a stop request ends the wait; and the real learner group answers
`wait_acks` while a step trains."""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest

from actors.weights.publication import Publication


class _Learners:
    """Stands in for the learner group, because a test must hold a generator's ack back at will: the real
    group is exercised below (`test_the_learner_group_answers_acks_while_a_step_trains`) and in the training
    runs. Versions count up from 1; each version's acks are what `answer(version, acks)` gives."""

    def __init__(self):
        self.version, self.calls = 0, []
        self.answers: dict[int, dict] = {}
        self.lock = threading.Lock()

    def publish_weights(self):
        with self.lock:
            self.version += 1
            self.calls.append(("publish", self.version))
            return {"version": self.version, "bad_control_messages": 0, "auth_refused": 0}

    def answer(self, version, acks):
        with self.lock:
            self.answers[version] = acks

    def wait_acks(self, version, timeout_s, excused=()):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if version in self.answers:
                    self.calls.append(("acked", version))
                    return self.answers[version]
                if "gen-0" in excused:  # as the publisher answers for a subscriber known down
                    self.calls.append(("excused", version))
                    return {"gen-0": (False, "stalled: its process is down")}
            time.sleep(0.01)
        raise TimeoutError(f"weights version {version}: no ack from gen-0")


def _publication(learners, stopping=lambda: False, served=None):
    return Publication(lambda: learners, 0, ack_timeout_s=30, stopping=stopping,
                       on_served=served or (lambda v: None), slice_s=0.2)


def test_publishing_does_not_wait_for_acks_and_the_next_version_waits_for_them():
    learners, served = _Learners(), []
    pub = _publication(learners, served=served.append)

    async def scenario():
        await pub.publish()
        assert (pub.published, pub.served) == (1, 0)  # the learner goes on; the generators still load 1
        second = asyncio.ensure_future(pub.publish())
        await asyncio.sleep(0.5)
        assert not second.done() and learners.calls == [("publish", 1)]  # version 2 waits for 1's acks
        learners.answer(1, {"gen-0": (True, "")})
        await asyncio.wait_for(second, 5)
        assert learners.calls == [("publish", 1), ("acked", 1), ("publish", 2)]
        assert pub.served == 1 and served == [1]
        learners.answer(2, {"gen-0": (True, "")})
        learners.answer(3, {"gen-0": (True, "")})
        await pub.publish(wait=True)  # waits for 2's acks, then for its own

    asyncio.run(scenario())
    assert (pub.published, pub.served) == (3, 3) and served == [1, 2, 3]
    assert learners.calls[-3:] == [("acked", 2), ("publish", 3), ("acked", 3)]


def test_a_generator_that_failed_to_load_stops_the_run_when_its_ack_arrives():
    learners = _Learners()
    pub = _publication(learners)

    async def scenario():
        await pub.publish()
        await pub.check()  # no ack yet: nothing to report
        learners.answer(1, {"gen-0": (False, "WeightUpdateError: lm_head.weight has shape (3,)"),
                            "gen-1": (True, "")})
        await asyncio.sleep(0.3)
        with pytest.raises(RuntimeError, match="gen-0.*lm_head.weight"):
            await pub.check()
        assert pub.served == 0  # the version was never served

    asyncio.run(scenario())


def test_a_stalled_generator_is_counted_and_the_version_still_served():
    learners = _Learners()
    pub = _publication(learners)
    learners.answer(1, {"gen-0": (False, "stalled: took no chunk for 60.0 s"), "gen-1": (True, "")})
    asyncio.run(pub.publish(wait=True))
    assert pub.served == 1 and pub.channel["transport/weights_stalled"] == 1


def test_a_replica_that_subscribed_after_the_version_went_out_gets_it_again():
    learners = _Learners()
    pub = _publication(learners)
    learners.answer(1, {"gen-0": (False, "stalled: subscribed after version 1 was sent"), "gen-1": (True, "")})
    asyncio.run(pub.publish(wait=True))
    assert pub.served == 1 and pub.take_resend() and not pub.take_resend()  # asked once
    learners.answer(2, {"gen-0": (False, "stalled: took no chunk for 60.0 s"), "gen-1": (True, "")})
    asyncio.run(pub.publish(wait=True))
    assert not pub.take_resend()  # a stalled replica has older weights and serves: nothing to send again


def test_a_stop_request_ends_the_wait_for_acks_within_a_slice():
    learners, stop = _Learners(), threading.Event()
    pub = _publication(learners, stopping=stop.is_set)

    async def scenario():
        await pub.publish()
        stop.set()
        started = time.monotonic()
        await asyncio.wait_for(pub.settle(), 5)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 1.0 and pub.served == 0


def test_the_watch_runs_while_acks_are_awaited_and_a_replica_seen_down_is_not_waited_for():
    """A generator died before it acked: the health check goes on between slices of the wait, and once it
    has seen the replica down the wait ends (long before ack_timeout_s) with the version served."""
    learners, down, checks = _Learners(), [], []

    async def check():
        checks.append(time.monotonic())
        if len(checks) == 3:
            down.append("gen-0")

    pub = Publication(lambda: learners, 0, ack_timeout_s=30, stopping=lambda: False, slice_s=0.2,
                      on_wait=check, excused=lambda: down)

    async def scenario():
        await pub.publish()
        started = time.monotonic()
        await asyncio.wait_for(pub.settle(), 5)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 2.0
    assert len(checks) == 3 and learners.calls == [("publish", 1), ("excused", 1)]
    assert pub.served == 1 and pub.channel["transport/weights_stalled"] == 1


def test_a_failing_health_check_ends_the_wait_for_acks_with_its_cause():
    learners = _Learners()

    async def check():
        raise RuntimeError("a channel of the run failed: every generator replica has been down for 301 s")

    pub = Publication(lambda: learners, 0, ack_timeout_s=30, stopping=lambda: False, slice_s=0.2, on_wait=check)

    async def scenario():
        await pub.publish()
        await asyncio.wait_for(pub.settle(), 5)

    with pytest.raises(RuntimeError, match="every generator replica has been down"):
        asyncio.run(scenario())


@pytest.fixture
def ray_local():
    """A local Ray for this test, shut down after it if the test started it (later modules start their own)."""
    from launch.job.ray_cluster import connect, shutdown

    started = connect(num_cpus=2)
    yield
    if started == "local":
        shutdown()


@pytest.mark.slow
def test_the_learner_group_answers_acks_while_a_step_trains(ray_local, tiny_model_dir):
    """A generator has not acked yet and the coordinator is waiting for it: the learner's next step still runs
    (wait_acks has its own Ray concurrency group), and the wait ends when the ack comes. With one thread for
    both, the step would queue behind the wait until it timed out."""
    from configs.learner import AlgorithmConfig, LearnerConfig
    from core.weights.subscriber import WeightSubscriber
    from launch.bench.samples import make_trajectory
    from launch.job.learners import LearnerGroup

    group = LearnerGroup(tiny_model_dir, "float32", LearnerConfig(num_ranks=1, zero_stage=1, num_cpus_per_rank=0.5),
                         AlgorithmConfig(adv_estimator="grpo"), setup_timeout_s=120)
    sub = WeightSubscriber(group.weights_endpoint, name="gen-0")
    try:
        assert group.wait_for_subscribers(1, 30) == 1
        version = group.publish_weights()["version"]
        assert sub.poll(10_000).version == version  # received, not acked: the generator is still loading
        waited: dict = {}
        waiter = threading.Thread(target=lambda: waited.update(group.wait_acks(version, 20)))
        waiter.start()
        time.sleep(0.5)  # the wait is in progress at the learner
        batch = [dataclasses.replace(make_trajectory(num_tokens=96, seed=i, trajectory_id=f"g.s{i}"), group_id="g",
                                     sample_index=i) for i in range(4)]
        batch = [dataclasses.replace(t, tokens=t.tokens % 500) for t in batch]  # the tiny model's vocabulary
        started = time.monotonic()
        metrics = group.train_step(batch)
        trained_s = time.monotonic() - started
        assert metrics["train/sampled_tokens"] > 0 and trained_s < 15
        assert waiter.is_alive() and not waited  # the step ran while the wait went on
        sub.ack(version)
        waiter.join(30)
        assert waited == {"gen-0": (True, "")}
        assert group.version() == version + 1
        # A subscriber the run knows is down is not waited for (the list reaches the publisher on rank 0).
        later = group.publish_weights()["version"]
        assert group.wait_acks(later, 5, ["gen-0"]) == {"gen-0": (False, "stalled: its process is down")}
    finally:
        sub.close()
        group.shutdown()
