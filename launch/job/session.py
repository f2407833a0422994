"""One training session: the roles it starts, what it resumes from, and what it writes as it goes."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from actors.coordinator import Coordinator, RunState
from actors.episode_watch import EpisodeWatch
from actors.group_buffer import GroupInfo
from configs.schema import RootConfig
from core.checkpoint import CheckpointStore, write_json, write_text_durably
from core.codec import WireLimits
from core.horizon import HorizonSchedule
from core.metrics import JsonlSink
from core.models import resolve_model, vocab_size
from core.rollout import EpisodeLimits
from core.staleness import StalenessGate
from core.transport import TrajectoryReceiver
from environments.item_sampler import mix_sampler
from launch.job.episodes import EPISODES_FILE, TrainingEpisodes
from launch.eval.runner import end_evaluations, eval_turns
from launch.job.progress import Progress
from launch.job.role_stats import RoleMemory, driver_tokens_per_s, ray_locate
from launch.job.pools import pool_names
from launch.job.roles import Roles, advertised, transport_keys
from launch.job.wandb_sink import run_sink

log = logging.getLogger("agentgym.session")


def _truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep the records of steps <= max_step (a resumed run rewrites what came after its checkpoint). A line
    that does not parse (a write cut short by a crash) is dropped with a warning."""
    if not path.exists():
        return
    kept = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("%s: dropping line %d, which is cut short or corrupt: %.80r", path.name, number, line)
            continue
        if isinstance(record, dict) and record.get("step", 0) <= max_step:
            kept.append(line)
    write_text_durably(path, "".join(line + "\n" for line in kept))


def check_transport_reach(host: str) -> None:
    """Loopback endpoints cannot be reached from other nodes: refuse them on a multi-node cluster."""
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    if host in ("127.0.0.1", "localhost") and len(nodes) > 1:
        raise SystemExit(f"launch.train: config error: transport.host: the Ray cluster has {len(nodes)} nodes, "
                         "so its ZMQ endpoints must bind to an interface the other nodes reach: set "
                         "transport.host to this node's address or 0.0.0.0 (it is 127.0.0.1)")


class TrainingSession:
    def __init__(self, cfg: RootConfig, out: Path, failures: list[str] | None = None):
        """`failures`: the causes of the earlier attempts of this run inside this job (launch.job.run rebuilds the
        roles after a failure and continues from the last complete checkpoint)."""
        self.failures = list(failures or [])
        self.cfg, self.out = cfg, out
        self.store = CheckpointStore(out / "checkpoints", cfg.checkpoint.keep_last)
        self.resume_from = self.store.resolve(cfg.checkpoint.resume)
        self.state = RunState()
        sampler_state = None
        if self.resume_from is not None:
            saved = json.loads((self.resume_from / "coordinator.json").read_text())
            self.state = RunState(**saved["state"])
            self.state.incarnation += 1
            sampler_state = saved["sampler"]
            log.info("resuming from %s at step %d", self.resume_from, self.state.step)
        self.schedule = HorizonSchedule.from_config(cfg.algorithm)
        self.sampler = mix_sampler(cfg.env, cfg.env.train_split, seed=cfg.trainer.seed)
        if sampler_state is not None:
            self.sampler.load_state_dict(sampler_state)
        for name in ("metrics.jsonl", "trained.jsonl", "groups.jsonl", EPISODES_FILE):
            _truncate_jsonl(out / name, self.state.step)
        self.roles: Roles | None = None
        self.coordinator: Coordinator | None = None
        self.progress: Progress | None = None
        self._stop = False

    # -- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        cfg = self.cfg
        check_transport_reach(cfg.transport.host)
        model_dir = resolve_model(cfg.model.path, cfg.model.cache_dir)
        self.keys = transport_keys(cfg)
        self.receiver = TrajectoryReceiver(
            cfg.transport.host, cfg.transport.trajectory_port, cfg.transport.hwm,
            limits=WireLimits(vocab_size=vocab_size(model_dir)),
            curve=self.keys.trajectory_server_side(pool_names(cfg.env.num_actors)) if self.keys else None,
            same_node=cfg.transport.same_node)
        limits = EpisodeLimits(
            max_tokens_per_turn=cfg.rollout.max_tokens_per_turn, max_context_tokens=cfg.rollout.max_context_tokens,
            min_tokens_per_turn=cfg.rollout.min_tokens_per_turn, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, format_reward=cfg.rollout.format_reward,
            format_reward_on=cfg.rollout.format_reward_on,
            format_reward_per=cfg.rollout.format_reward_per,
            format_reward_no_ops=cfg.rollout.format_reward_no_ops,
            format_reward_revisits=cfg.rollout.format_reward_revisits,
            repeat_penalty=cfg.rollout.repeat_penalty,
            instruction_role=cfg.rollout.instruction_role)
        self.roles = Roles.start(cfg, model_dir, advertised(self.receiver.endpoints), limits,
                                 resume_learner=self.resume_from / "learner" if self.resume_from else None,
                                 keys=self.keys)
        write_json(self.out / "placement.json", self.roles.placement())
        write_json(self.out / "pids.json", self.roles.pids())
        roles = self.roles
        self.memory = RoleMemory(lambda: ray_locate(roles._actors()))  # each role's RSS every step
        write_json(self.out / "transport.json", self._transport_record())
        write_json(self.out / "model.json", {"base": cfg.model.path, "resolved": str(model_dir)})  # launch.eval
        self.metrics = JsonlSink(self.out / "metrics.jsonl")
        self.wandb = run_sink(cfg, self.out, self.state.wandb_run_id)
        self.state.wandb_run_id = getattr(self.wandb, "run_id", "")
        self.episodes = TrainingEpisodes(self.out / EPISODES_FILE, str(model_dir), cfg.logging.episodes_every,
                                         cfg.logging.episodes_per_sample, cfg.logging.episodes_max_mb, self.wandb)
        self.trained_log = open(self.out / "trained.jsonl", "a")
        self.groups_log = open(self.out / "groups.jsonl", "a")
        self.progress = Progress(cfg.trainer.total_steps, self.state.step, enabled=cfg.logging.progress_bar,
                                 eval_turns=sum(eval_turns(c) for c, _ in end_evaluations(cfg)) if cfg.eval.at_end
                                 else 0)
        gate = StalenessGate(cfg.trainer.max_staleness, cfg.trainer.groups_per_step,
                             started=self.state.step * cfg.trainer.groups_per_step)
        slots = cfg.env.num_actors * cfg.env.slots_per_actor
        self.coordinator = Coordinator(
            pools=self.roles.pools, learners=self.roles.learners, receiver=self.receiver, sampler=self.sampler,
            gate=gate, schedule=self.schedule, group_size=cfg.rollout.group_size, total_steps=cfg.trainer.total_steps,
            max_in_flight=max(cfg.trainer.groups_per_step, -(-2 * slots // cfg.rollout.group_size)),
            on_step=self._on_step, should_checkpoint=self._should_checkpoint, save=self._save,
            state=self.state, ack_timeout_s=cfg.transport.weights_ack_timeout_s,
            on_group_started=self._on_group_started, health=self.roles.health,
            needs_republish=self.roles.needs_republish, down=self.roles.down_replicas,
            episode_watch=EpisodeWatch(cfg.env.failing_window, cfg.env.failing_frac),
            max_trained_turns=cfg.trainer.max_trained_turns, batch_order=cfg.trainer.batch_order,
            admit_during_step=cfg.trainer.admit_during_step)
        if self._stop:
            self.coordinator.stop_requested = True
        self.untrained, self.untrained_notes = self._untrained_rows()

    def _untrained_rows(self) -> tuple[dict[str, list[dict] | None], list[str]]:
        """The base model's eval figures for the final report (eval.at_end and eval.baselines), for each end
        evaluation (by its folder): measured now, before the first step, while the generators hold the base
        weights (version 0), and kept in <folder>/untrained.json so that a resumed run reuses them. Cost: one
        more evaluation's generation per turn limit."""
        cfg = self.cfg
        if not (cfg.eval.at_end and cfg.eval.baselines):
            return {}, []
        rows, notes = {}, []
        for at, folder in end_evaluations(cfg):
            rows[folder], note = self._untrained_at(at, self.out / folder)
            notes += [n for n in note if n not in notes]
        return rows, notes

    def _untrained_at(self, cfg: RootConfig, out: Path) -> tuple[list[dict] | None, list[str]]:
        from launch.eval.runner import eval_limits, evaluate_rows, measured_on, same_measure

        path = out / "untrained.json"
        # what the rows were measured on: a resumed run with other eval settings cannot reuse them
        measure = measured_on(cfg)
        if path.is_file():
            saved = json.loads(path.read_text())
            if same_measure(saved.get("measured_on"), measure):
                return saved["rows"], []
        if self.resume_from is not None:
            return None, [("no untrained row: the base model was not evaluated on these items before the run's "
                           "first step (it resumed from a checkpoint)")]

        log.info("evaluating the base model before the first step (eval.baselines) at %s turns, for the final "
                 "report", cfg.eval.max_turns or "the reference's")
        rows = evaluate_rows(cfg, self.roles.policy, str(self.roles.model_dir), out, list(cfg.eval.envs),
                             eval_limits(cfg), name="eval-base-pool", row="untrained")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"model": cfg.model.path, "rows": rows, "measured_on": measure})
        return rows, []

    def _transport_record(self) -> dict:
        """Endpoints and server public keys (public keys are no secret; the key pairs never leave memory)."""
        keys = self.keys
        return {"auth": "curve" if keys else "off",
                "cipher": keys.cipher if keys else "",
                "trajectory_endpoint": advertised(self.receiver.endpoint),
                "trajectory_same_node_endpoint": getattr(self.receiver, "local_endpoint", ""),
                "weights_endpoint": advertised(self.roles.learners.weights_endpoint,
                                               self.roles.learners.rank0_address),
                "trajectory_server_public": keys.trajectory_server.public.decode() if keys else "",
                "weights_server_public": keys.weights_server.public.decode() if keys else ""}

    async def train(self) -> RunState:
        started = time.monotonic()
        state = await self.coordinator.run()
        log.info("trained %d steps in %.1f min", state.step, (time.monotonic() - started) / 60)
        return state

    def request_stop(self) -> None:
        self._stop = True
        if self.coordinator is not None:
            self.coordinator.stop_requested = True

    def finish(self, evaluate: bool) -> None:
        """Final checkpoint (unless this step has one already), the plot, and the evaluation."""
        if self.store.latest_complete() != self.store.path_of(self.state.step):
            self._save(self.coordinator.snapshot())
        from launch.job.plot import plot_run

        plot_run(self.out / "metrics.jsonl", self.out / "training.png", title=self.out.name)
        if evaluate:
            from launch.eval.runner import evaluate_with

            untrained = getattr(self, "untrained", {})
            for cfg, folder in end_evaluations(self.cfg):  # eval/, then eval-<N>-turns/ (eval.long_max_turns)
                evaluate_with(cfg, self.roles, self.out / folder,
                              model_name=f"{cfg.model.path} after {self.state.step} steps ({self.out.name})",
                              untrained=untrained.get(folder), notes=getattr(self, "untrained_notes", []),
                              untrained_name=f"{cfg.model.path}, base weights (evaluated before the first step)")

    def close(self) -> None:
        """Stop every role and close every file (once; a second call does nothing)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        for f in ("trained_log", "groups_log"):
            if hasattr(self, f):
                getattr(self, f).close()
        if self.progress is not None:
            self.progress.close()
        for sink in ("metrics", "wandb"):
            if getattr(self, sink, None) is not None:
                getattr(self, sink).close()
        if self.roles is not None:
            self.roles.stop()
        if hasattr(self, "receiver"):
            self.receiver.close()

    # -- callbacks from the coordinator ------------------------------------------------------------------------

    def _on_group_started(self, info: GroupInfo) -> None:
        self.groups_log.write(json.dumps({"step": info.started_step, "group_id": info.group_id,
                                          "item_id": info.item_id, "draw": info.draw, "horizon": info.horizon,
                                          "version": info.started_version, "attempt": info.attempt,
                                          "time": time.time()}) + "\n")  # when admitted (bench async)
        self.groups_log.flush()

    def _on_step(self, step: int, metrics: dict[str, float], batch: list[GroupInfo]) -> None:
        metrics["rollout/horizon_in_force"] = float(self.schedule.horizon_at(step))
        metrics["recovery/failures"] = float(len(self.failures))
        metrics["rollout/horizon_stage"] = float(self.schedule.stage_at(step))
        if step % self.cfg.logging.log_every == 0 or step == self.cfg.trainer.total_steps:
            metrics.update(self.roles.stats())
        metrics.update(self.memory.sample())
        metrics["perf/driver/tokens_per_s"] = driver_tokens_per_s(metrics)
        metrics.update(self.episodes.keep(step, [t for g in batch for t in g.samples]))
        self.metrics.log(step, metrics)
        if self.wandb is not None:
            self.wandb.log(step, metrics)
        self.trained_log.write(json.dumps({
            "step": step, "version_trained": int(metrics.get("policy/version", step)) - 1,
            "groups": [g.group_id for g in batch],
            "trajectories": [t.trajectory_id for g in batch for t in g.samples],
            "oldest_versions": [t.oldest_version() for g in batch for t in g.samples],
            "horizons": [g.horizon for g in batch], "time": time.time()}) + "\n")  # when trained (bench async)
        self.trained_log.flush()
        self.progress.update(step, metrics)

    def _should_checkpoint(self, step: int) -> bool:
        every = self.cfg.checkpoint.every_steps
        return (every > 0 and step % every == 0) or self._stop

    def _save(self, state: RunState) -> None:
        tmp = self.store.begin(state.step)
        self.roles.learners.save_checkpoint(str(tmp / "learner"))
        self.roles.save_policy(tmp / "policy")
        write_json(tmp / "coordinator.json", {"state": dataclasses.asdict(state),
                                              "sampler": self.sampler.state_dict()})
        final = self.store.commit(tmp, state.step, {"version": state.version})
        log.info("checkpoint %s", final)
