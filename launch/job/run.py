"""The training run: start every role from the config, run the coordinator, then plot and evaluate.

Roles are placed by Ray resources from the config (learner ranks in a placement group, generator replicas
spread over nodes, env-pool actors wherever CPUs are free), so one recipe runs on a laptop or on many nodes by
changing counts. The run's folder (`trainer.output_dir`) receives: checkpoints/, metrics.jsonl, trained.jsonl
(the lineage: which groups each step trained), groups.jsonl (every group started), wandb/, training.png, and
the eval report.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
from pathlib import Path

from actors.episode_watch import EpisodesFailing
from configs.schema import RootConfig
from launch.job.local_shop import ServedShop
from launch.job.ray_cluster import connect, joins_address, shutdown
from launch.job.stop import SignalStop

log = logging.getLogger("agentgym.run")


def run_training(cfg: RootConfig) -> int:
    """Train; when the run fails (a learner rank died, every generator is gone, a channel broke), rebuild every
    role and continue from the last complete checkpoint, at most `trainer.max_failures` times, then stop
    naming every cause. The lineage log keeps each group trained at most once across the attempts."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    out = Path(cfg.trainer.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg, shop = ServedShop.start(cfg, out, joins_cluster=joins_address(cfg.ray.address))
    try:
        return _attempts(cfg, out)
    finally:
        if shop is not None:
            shop.close()


def _attempts(cfg: RootConfig, out: Path) -> int:
    connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.namespace, quiet=not cfg.logging.verbose,
            allow_insecure=cfg.transport.allow_insecure)
    from launch.job.session import TrainingSession  # after Ray is up: it imports the roles

    current: list = []  # the session of the attempt in progress, for the signal handler
    stopper = SignalStop(lambda why: current and current[-1].request_stop(), cfg.checkpoint.stop_grace_s).install()
    failures: list[str] = []
    try:
        while True:
            session = TrainingSession(cfg, out, failures)
            current.append(session)
            if stopper.signal is not None:
                session.request_stop()
            try:
                session.start()
                state = asyncio.run(session.train())
            except EpisodesFailing as exc:  # rebuilding the roles would fail the same way: stop, naming it
                log.error("%s", exc)
                session.close()
                return 1
            except Exception as exc:
                if stopper.signal is not None or len(failures) >= cfg.trainer.max_failures:
                    if failures:
                        log.error("the run failed %d times; causes: %s", len(failures) + 1, failures)
                    raise
                failures.append(f"{type(exc).__name__}: {str(exc)[:400]}")
                log.error("the run failed (%s); rebuilding its roles and continuing from the last complete "
                          "checkpoint (failure %d of trainer.max_failures = %d)", failures[-1], len(failures),
                          cfg.trainer.max_failures)
                session.close()
                current.pop()
                cfg = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, resume="auto"))
                continue
            finished = state.step >= cfg.trainer.total_steps or session.coordinator.turns_spent
            session.finish(evaluate=finished and cfg.eval.at_end and stopper.signal is None)
            if stopper.signal is not None:
                print(f"stopped at step {state.step} by {signal.Signals(stopper.signal).name}; "
                      "continue with checkpoint.resume=auto")
            print(f"run folder: {out}")
            return 0
    finally:
        for session in current:
            session.close()
        shutdown()
        stopper.restore()
