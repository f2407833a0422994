"""The training run: start every role from the config, run the coordinator, then plot and evaluate.

Roles are placed by Ray resources from the config (learner ranks in a placement group, generator replicas
spread over nodes, env-pool actors wherever CPUs are free), so one recipe runs on a laptop or on many nodes by
changing counts. The run's folder (`trainer.output_dir`) receives: checkpoints/, metrics.jsonl, trained.jsonl
(the lineage: which groups each step trained), groups.jsonl (every group started), wandb/, training.png, and
the eval report.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from configs.schema import RootConfig
from launch.ray_cluster import connect, shutdown
from launch.stop import SignalStop

log = logging.getLogger("agentgym.run")


def run_training(cfg: RootConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    out = Path(cfg.trainer.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.namespace)
    from launch.session import TrainingSession  # after Ray is up: it imports the roles

    session = TrainingSession(cfg, out)
    stopper = SignalStop(lambda why: session.request_stop(), cfg.checkpoint.stop_grace_s).install()
    try:
        session.start()
        state = asyncio.run(session.train())
        finished = state.step >= cfg.trainer.total_steps
        session.finish(evaluate=finished and cfg.eval.at_end and stopper.signal is None)
        if stopper.signal is not None:
            print(f"stopped at step {state.step} by {signal.Signals(stopper.signal).name}; "
                  "continue with checkpoint.resume=auto")
        print(f"run folder: {out}")
        return 0
    finally:
        session.close()
        shutdown()
        stopper.restore()
