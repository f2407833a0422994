"""One learner rank: a DeepSpeed ZeRO engine that trains the policy with decoupled PPO.

A plain class; launch/job/learners.py makes one Ray actor per data-parallel rank. Lifecycle: `listen` (rank 0,
for the rendezvous) -> `setup` on every rank at once -> `train_step` / `publish_weights` / `save_checkpoint` /
`load_checkpoint`, called on every rank with the same arguments except the batch shard.

What must hold:
- Every rank runs the same collectives in the same order: before each pass the ranks agree (all-reduce max)
  on the number of micro-batches, and a rank that runs short packs padding micro-batches.
- Before any update of a train step, the proximal logprobs of every sampled token are recomputed with the
  weights as they are then, under no_grad, and stay fixed for all the step's mini-batches and epochs. The
  coupled loss (algorithm.policy_loss=coupled, the off-policy ablation) uses the behaviour logprobs in their
  place, so it skips that pass unless GAE needs the pass's values.
- The loss of a mini-batch is its mean over all ranks' tokens (or sequences): token weights are normalised by
  global totals, and scaled by the world size because DeepSpeed averages gradients over ranks.
- `version` counts completed train steps (plus the version loaded from a checkpoint); weights published as
  version v are the weights after v train steps. Rank 0 alone publishes; every rank takes part in gathering.
- `wait_acks` may be called from another thread while a step trains (launch/job/learners.py gives it its own
  Ray concurrency group), so that generators take version v while the learner trains v + 1; the publisher's
  sockets are used under one lock, by one thread at a time.
- A checkpoint (DeepSpeed's format: model, optimizer, LR scheduler, plus the version) is written by every rank
  into one directory, which must be shared storage when ranks live on different nodes.
"""
from __future__ import annotations

import logging
import resource
import threading
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from actors import zero_engine
from configs.learner import AlgorithmConfig, LearnerConfig
from core import advantages as adv
from core.batching import MicroBatch, TrainSample, count_micro_batches, micro_batches, split
from core.cpu_affinity import pin_to_cores
from core.cpu_features import resolve_cpu_autocast
from core.curve import CurveServer
from core.loss import MAX_KEYS, SUM_KEYS, LossSettings, aggregation_weights, decoupled_ppo_loss, finish_stats
from core.lr_schedule import lr_multiplier
from core.models import save_policy_folder
from core.packed_attention import NAME as PACKED_SDPA
from core.packed_attention import register as register_packed_sdpa
from core.token_scorer import Scores, TokenScorer, policy_state_names
from core.trajectory import Trajectory
from core.weights.publisher import WeightPublisher
from core.weights.tensors import TensorBytes

log = logging.getLogger("agentgym.learner")

CHECKPOINT_TAG = "learner"
STALENESS_BUCKETS = 8  # staleness/0 .. staleness/7, then staleness/8+ (and staleness/ahead, never expected)


@dataclass(frozen=True)
class PublisherOptions:
    """Where and how rank 0 publishes weights (see core.weights.publisher.WeightPublisher)."""

    host: str
    port: int = 0
    chunk_bytes: int = 64 << 20
    curve: CurveServer | None = None
    subscribers: list[str] | None = None  # the names admitted without CURVE (None: any)
    stall_timeout_s: float = 60.0
    fanout: str = "star"  # star or relay (core.weights.relay)
    sync: str = "zmq"  # zmq, or collective (actors.weights.group_publisher)
    workers_per_replica: int = 1  # collective: each replica's vLLM workers (its tensor-parallel size on GPU)
    timeout_s: float = 300.0  # collective: how long a member may take its part in a transfer
    shm: bool = True  # zmq: same-node subscribers read versions from shared memory (core.weights.shm)
    bucket_bytes: int = 512 << 20  # collective: the largest bucket a version moves in (actors.weights.group_buckets)


def prepare_samples(trajectories: Sequence[Trajectory], algorithm: AlgorithmConfig) -> list[TrainSample]:
    """Attach advantages computed over the whole batch (none for gae: the ranks compute those)."""
    if algorithm.adv_estimator == "gae":
        return [TrainSample(t) for t in trajectories]
    advantages = adv.compute_advantages(trajectories, algorithm.adv_estimator, gamma=algorithm.gamma,
                                        norm_by_std=algorithm.norm_adv_by_std)
    return [TrainSample(t, a) for t, a in zip(trajectories, advantages)]


class Learner:
    def __init__(self, rank: int, world_size: int, model_path: str, dtype: str, learner: LearnerConfig,
                 algorithm: AlgorithmConfig, sampling_temperature: float = 1.0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside [0, {world_size})")
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype: expected float32 or bfloat16, got {dtype!r}")
        self.rank, self.world_size = rank, world_size
        self.model_path, self.dtype = str(model_path), dtype
        self.cfg, self.algo = learner, algorithm
        self.sampling_temperature = sampling_temperature
        # bfloat16 matrix products under float32 weights, on CPU ranks only (learner.cpu_autocast)
        self.autocast = False
        if dtype == "float32" and learner.num_gpus_per_rank == 0:
            mode, why = resolve_cpu_autocast(learner.cpu_autocast)
            self.autocast = mode == "bfloat16"
            if rank == 0:
                (log.warning if why.startswith("emulated") else log.info)(
                    "learner: matrix products in %s (%s)", "bfloat16" if self.autocast else "float32", why)
        self.settings = LossSettings(
            clip_eps_low=algorithm.clip_eps_low, clip_eps_high=algorithm.clip_eps_high,
            behaviour_weight_cap=algorithm.behaviour_weight_cap, entropy_coef=algorithm.entropy_coef,
            kl_coef=algorithm.kl_coef, kl_type=algorithm.kl_type, value_clip=algorithm.value_clip,
            value_coef=algorithm.value_coef, policy_loss=algorithm.policy_loss)
        self.version = 0
        self.updates = 0
        self.engine = None
        self.reference = None
        self.publisher: WeightPublisher | None = None
        self._publishing = threading.Lock()  # the publisher's sockets: one thread at a time
        self._listener = None  # rank 0's rendezvous socket (listen)

    # -- set-up ---------------------------------------------------------------------------------------------

    def listen(self, host: str) -> int:
        """Rank 0: open the rendezvous listener on `host` (only there) and return its port."""
        self._listener = zero_engine.listen_socket(host)
        return int(self._listener.getsockname()[1])

    def setup(self, master_addr: str, master_port: int, publisher: PublisherOptions | None = None) -> dict:
        """Join the process group, load the model into a ZeRO engine, and (rank 0, if `publisher` is given)
        bind the weights publisher. Every rank must call this at the same time."""
        import deepspeed
        from transformers import AutoModelForCausalLM

        use_gpu = self.cfg.num_gpus_per_rank > 0
        pin_to_cores(self.cfg.cpu_cores, "learner.cpu_cores")
        if not use_gpu:  # as many threads as CPUs reserved (or pinned), and one for a fractional reservation
            threads = self.cfg.torch_threads or len(self.cfg.cpu_cores) or int(self.cfg.num_cpus_per_rank)
            torch.set_num_threads(max(1, threads))
        self.device = zero_engine.init_process_group(self.rank, self.world_size, master_addr, master_port,
                                                     use_gpu, listener=self._listener)
        torch.manual_seed(self.cfg.seed)
        torch_dtype = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
        if self.cfg.attn_implementation == PACKED_SDPA:
            register_packed_sdpa()
        policy = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype,
                                                      attn_implementation=self.cfg.attn_implementation)
        if self.cfg.gradient_checkpointing:
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.config.use_cache = False
        scorer = TokenScorer(policy, with_value_head=self.algo.adv_estimator == "gae",
                             temperature=self.sampling_temperature).to(torch_dtype)
        self._policy_tensors = policy_state_names(scorer)  # names taken before ZeRO partitions anything

        decay = [p for p in scorer.parameters() if p.ndim >= 2]
        no_decay = [p for p in scorer.parameters() if p.ndim < 2]
        # fused: one kernel over each flat ZeRO partition, without the full-size temporaries of the plain loop
        # (a 135M model peaked 1 GB lower on CPU, and stepped a little faster)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=self.cfg.lr, betas=tuple(self.cfg.betas), fused=True)
        c = self.cfg
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_multiplier(
            i, warmup_steps=c.warmup_steps, schedule=c.lr_schedule, decay_steps=c.lr_decay_steps,
            min_ratio=c.min_lr_ratio))
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=scorer, optimizer=optimizer, lr_scheduler=schedule,
            config=zero_engine.deepspeed_config(c.zero_stage, self.dtype, c.grad_clip))
        if self.algo.kl_coef > 0:
            ref_policy = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype,
                                                              attn_implementation=c.attn_implementation)
            ref = TokenScorer(ref_policy, temperature=self.sampling_temperature).to(torch_dtype).eval()
            ref.requires_grad_(False)
            if c.zero_stage == 3:
                ref, *_ = deepspeed.initialize(model=ref, config=zero_engine.inference_config(3, self.dtype))
            else:
                ref = ref.to(self.device)
            self.reference = ref
        if self.rank == 0 and publisher is not None and publisher.sync == "collective":
            from actors.weights.group_publisher import CollectivePublisher

            p = publisher
            self.publisher = CollectivePublisher(p.host, p.port, list(p.subscribers or []), p.workers_per_replica,
                                                 self.device, self.dtype, timeout_s=p.timeout_s,
                                                 bucket_bytes=p.bucket_bytes)
        elif self.rank == 0 and publisher is not None:
            p = publisher
            self.publisher = WeightPublisher(p.host, p.port, chunk_bytes=p.chunk_bytes, curve=p.curve,
                                             expected=p.subscribers, stall_timeout_s=p.stall_timeout_s,
                                             fanout=p.fanout, shm=p.shm, await_expected=True)
        n_params = sum(int(getattr(p, "ds_numel", p.numel())) for p in scorer.parameters())
        return {"rank": self.rank, "parameters": n_params, "weights_endpoint": self.weights_endpoint()}

    def weights_endpoint(self) -> str | None:
        return self.publisher.endpoint if self.publisher is not None else None

    # -- training -------------------------------------------------------------------------------------------

    def _agree(self, values: Sequence[float], op: str) -> list[float]:
        return zero_engine.all_reduce(values, op, self.device)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _run(self, model, mb: MicroBatch, with_entropy: bool, entropy_grad: bool = False) -> Scores:
        t = self._tensor
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):  # backward runs outside it
            return Scores.of(model(t(mb.input_ids), t(mb.position_ids), t(mb.score_index), t(mb.targets),
                                   with_entropy=with_entropy, entropy_grad=entropy_grad))

    def _plan(self, trajs, members: Sequence[int]) -> list[MicroBatch]:
        """Micro-batches of `members`, padded to the count every rank agrees on."""
        local = count_micro_batches(trajs, members, self.cfg.micro_batch_tokens)
        agreed = int(self._agree([local], "max")[0])
        return micro_batches(trajs, members, self.cfg.micro_batch_tokens, at_least=agreed)

    def _proximal_pass(self, trajs, policy: bool = True) -> tuple[list[np.ndarray] | None,
                                                                 list[np.ndarray] | None,
                                                                 list[np.ndarray] | None, float]:
        """Proximal logprobs [T] per trajectory (and values, reference logprobs), with today's weights, no
        grad. Returns the entropy summed over sampled tokens too (a metric of the proximal policy). With
        `policy=False` only the reference model runs (proximal and values are None), and not at all without one."""
        def zeros() -> list[np.ndarray]:
            return [np.zeros(t.num_tokens, np.float32) for t in trajs]

        proximal = zeros() if policy else None
        values = zeros() if policy and self.algo.adv_estimator == "gae" else None
        reference = zeros() if self.reference is not None else None
        entropy_sum = 0.0
        if not policy and reference is None:
            return proximal, values, reference, entropy_sum
        with torch.no_grad():
            for mb in self._plan(trajs, list(range(len(trajs)))):
                out = self._run(self.engine, mb, with_entropy=True) if policy else None
                if self.reference is not None:
                    ref = self._run(self.reference, mb, with_entropy=False)
                if mb.padding:
                    continue
                if out is not None:
                    mb.scatter(out.logprobs.float().cpu().numpy(), proximal)
                    entropy_sum += float(out.entropy.float().sum())
                if values is not None:
                    mb.scatter(out.values.float().cpu().numpy(), values)
                if reference is not None:
                    mb.scatter(ref.logprobs.float().cpu().numpy(), reference)
        return proximal, values, reference, entropy_sum

    def train_step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One learner step on this rank's shard of the batch: proximal pass, then `ppo_epochs` passes of
        `mini_batches` optimizer steps each. Returns metrics over the whole batch (all ranks), named
        `train/...`; `train/staleness/<k>` is the fraction of sampled tokens sampled k versions before this
        step."""
        if self.engine is None:
            raise RuntimeError("train_step before setup")
        start = time.perf_counter()
        gae = self.algo.adv_estimator == "gae"
        for s in samples:
            s.validate()
            if not gae and s.advantages is None:
                raise ValueError(f"trajectory {s.trajectory.trajectory_id}: no advantages given for "
                                 f"adv_estimator={self.algo.adv_estimator}")
        trajs = [s.trajectory for s in samples]
        self.engine.train()
        # One optimizer step over the batch: the proximal policy is the current one before that step, so the
        # training forward's own (detached) logprobs serve, and the separate no-grad pass is skipped.
        fused = (self.cfg.fuse_proximal_pass and self.cfg.ppo_epochs == 1 and self.cfg.mini_batches == 1
                 and not gae)
        # The coupled loss takes the behaviour logprobs as the proximal ones: the pass is needed only for values.
        coupled = self.settings.policy_loss == "coupled" and not gae
        proximal, values, reference, entropy_sum = self._proximal_pass(trajs, policy=not (fused or coupled))
        returns = None
        if gae:
            pairs = [adv.gae(t, v, self.algo.gamma, self.algo.lam) for t, v in zip(trajs, values)]
            advantages = [a for a, _ in pairs]
            returns = [r for _, r in pairs]
        else:
            advantages = [s.advantages for s in samples]
        behaviour = [t.logprobs for t in trajs]

        sums = dict.fromkeys(SUM_KEYS, 0.0)
        maxima = dict.fromkeys(MAX_KEYS, 0.0)
        grad_norms, lrs = [], []
        rng = np.random.default_rng((self.cfg.seed, self.version))
        sizes = [t.num_tokens for t in trajs]
        for epoch in range(self.cfg.ppo_epochs):
            order = list(range(len(trajs))) if epoch == 0 else [int(i) for i in rng.permutation(len(trajs))]
            for part in split(order, [sizes[i] for i in order], self.cfg.mini_batches):
                self._update(trajs, sorted(part), proximal, behaviour, advantages, values, returns, reference,
                             sums, maxima)
                grad_norm = self.engine.get_global_grad_norm()
                grad_norms.append(float(grad_norm) if grad_norm is not None else float("nan"))
                lrs.append(float(self.engine.get_lr()[0]))
        metrics = self._metrics(trajs, sums, maxima, sums.pop("entropy_sum", entropy_sum))
        metrics.update(grad_norm=float(np.mean(grad_norms)), grad_norm_max=float(np.max(grad_norms)),
                       lr=lrs[-1], optimizer_steps=float(len(grad_norms)), version=float(self.version + 1),
                       step_seconds=time.perf_counter() - start)
        self.version += 1
        return {f"train/{k}": v for k, v in metrics.items()}

    def _update(self, trajs, part: list[int], proximal, behaviour, advantages, values, returns, reference,
                sums: dict, maxima: dict) -> None:
        """One optimizer step over mini-batch `part` (indices into trajs) on this rank."""
        mbs = self._plan(trajs, part)
        local_tokens = sum(int(trajs[i].loss_mask.sum()) for i in part)
        local_seqs = sum(1 for i in part if trajs[i].loss_mask.any())
        total_tokens, total_seqs = self._agree([local_tokens, local_seqs], "sum")
        fused = proximal is None  # the proximal logprobs are this forward's own, detached (unused when coupled)
        entropy_loss = self.settings.entropy_coef > 0  # otherwise the entropy is a metric, with no graph
        t = self._tensor
        for mb in mbs:
            out = self._run(self.engine, mb, with_entropy=entropy_loss or fused, entropy_grad=entropy_loss)
            weights = aggregation_weights(t(mb.seq_token_count), self.algo.loss_agg, total_tokens, total_seqs)
            # DeepSpeed averages gradients over ranks; the weights already make the global mean, so undo that.
            weights = weights * self.world_size if not mb.padding else torch.zeros_like(weights)
            if fused and not mb.padding:
                sums["entropy_sum"] = sums.get("entropy_sum", 0.0) + float(out.entropy.detach().float().sum())
            loss = decoupled_ppo_loss(
                out.logprobs, out.logprobs.detach() if fused else t(mb.gather(proximal)),
                t(mb.gather(behaviour)), t(mb.gather(advantages)),
                weights, self.settings, entropy=out.entropy,
                reference=t(mb.gather(reference)) if reference is not None else None,
                values=out.values, old_values=t(mb.gather(values)) if values is not None else None,
                returns=t(mb.gather(returns)) if returns is not None else None)
            self.engine.backward(loss.loss)
            for k, v in loss.sums.items():
                sums[k] += v
            for k, v in loss.maxima.items():
                maxima[k] = max(maxima[k], v)
        self.engine.step()
        self.updates += 1

    def _metrics(self, trajs, sums: dict, maxima: dict, entropy_sum: float) -> dict[str, float]:
        """Sums over all ranks, turned into means; the staleness histogram as fractions of sampled tokens."""
        stale = np.zeros(STALENESS_BUCKETS + 2)  # 0..7, 8+, ahead
        for t in trajs:
            lag = self.version - t.versions[t.loss_mask.astype(bool)].astype(np.int64)
            stale[-1] += int((lag < 0).sum())
            lag = lag[lag >= 0]
            stale[:STALENESS_BUCKETS + 1] += np.bincount(np.minimum(lag, STALENESS_BUCKETS),
                                                        minlength=STALENESS_BUCKETS + 1)
        sampled = sum(int(t.loss_mask.sum()) for t in trajs)
        rewards = [t.total_reward for t in trajs]
        local = [sums[k] for k in SUM_KEYS] + list(stale) + [entropy_sum, sampled, len(trajs), sum(rewards),
                                                             sum(t.num_tokens for t in trajs)]
        total = self._agree(local, "sum")
        top = self._agree([maxima[k] for k in MAX_KEYS] + [max(rewards, default=-np.inf)], "max")
        n = len(SUM_KEYS)
        out = finish_stats(dict(zip(SUM_KEYS, total[:n])), dict(zip(MAX_KEYS, top[:len(MAX_KEYS)])))
        hist, (ent, n_sampled, n_traj, reward_sum, n_tokens) = total[n:n + len(stale)], total[n + len(stale):]
        denom = max(n_sampled, 1.0)
        for k in range(STALENESS_BUCKETS):
            out[f"staleness/{k}"] = hist[k] / denom
        out[f"staleness/{STALENESS_BUCKETS}+"] = hist[STALENESS_BUCKETS] / denom
        out["staleness/ahead"] = hist[-1] / denom
        # entropy: of the proximal policy on the batch's sampled tokens (whether or not it is a bonus)
        out.update(entropy=ent / denom, sampled_tokens=n_sampled, trajectories=n_traj,
                   reward_mean=reward_sum / max(n_traj, 1.0), reward_max=top[-1], batch_tokens=n_tokens)
        if self.reference is None:
            del out["kl_ref"]
        if self.algo.adv_estimator != "gae":
            del out["value_loss"], out["value_clip_frac"]
        return out

    # -- weights and checkpoints ----------------------------------------------------------------------------

    def gather_weights(self) -> list[TensorBytes]:
        """The policy's full weights under their checkpoint names, on rank 0 ([] elsewhere). Collective."""
        return zero_engine.gather_full_weights(self._policy_tensors, self.rank)

    def save_policy(self, folder: str) -> None:
        """The current policy as a model folder beside the base model's config and tokenizer, written by rank 0
        where it gathers them: the full weights never travel to the driver. Collective (every rank gathers)."""
        tensors = self.gather_weights()
        if self.rank == 0:
            save_policy_folder(tensors, self.model_path, folder)

    def publish_weights(self) -> dict:
        """Gather (every rank) and send the current version to every subscriber (rank 0)."""
        with self._publishing:
            return self._publish_weights()

    def _publish_weights(self) -> dict:
        start = time.perf_counter()
        sent, bad, refused, relinked = 0, 0, 0, 0
        if self.publisher is not None and not isinstance(self.publisher, WeightPublisher):
            # The weights group: each tensor is broadcast while it is gathered (the other ranks gather alongside).
            specs, aliases = zero_engine.full_weight_layout(self._policy_tensors)
            sent = self.publisher.publish_stream(self.version, specs, aliases,
                                                 zero_engine.iter_full_weights(self._policy_tensors))
            return {"version": self.version, "bytes": sent, "seconds": time.perf_counter() - start,
                    "bad_control_messages": self.publisher.drops.total, "auth_refused": 0, "relinked": 0}
        tensors = self.gather_weights()
        if self.publisher is not None:
            sent = self.publisher.publish(self.version, tensors)
            bad = self.publisher.drops.total
            refused = self.publisher.auth_refused
            relinked = self.publisher.relinked  # relay chains re-linked around a replica, since start
        return {"version": self.version, "bytes": sent, "seconds": time.perf_counter() - start,
                "bad_control_messages": bad, "auth_refused": refused, "relinked": relinked}

    def wait_for_subscribers(self, n: int, timeout_s: float) -> int:
        with self._publishing:
            if self.publisher is None:
                return 0
            self.publisher.wait_for_peers(n, timeout_s)
            return len(self.publisher.peers)

    def wait_acks(self, version: int, timeout_s: float, excused: Sequence[str] = ()) -> dict[str, tuple[bool, str]]:
        """{subscriber: (ok, error)} once every subscriber acked `version` (TimeoutError after `timeout_s`); one
        in `excused` (known down) counts as skipped. Safe to call while a step trains on another thread."""
        with self._publishing:
            return self.publisher.wait_acks(version, timeout_s, excused) if self.publisher is not None else {}

    def save_checkpoint(self, path: str) -> None:
        """Model, optimizer and LR scheduler in DeepSpeed's layout under `path`/learner, plus the version."""
        self.engine.save_checkpoint(path, tag=CHECKPOINT_TAG, save_latest=False,
                                    client_state={"version": self.version, "updates": self.updates})

    def load_checkpoint(self, path: str) -> dict:
        """Restore what `save_checkpoint` wrote; returns {"version", "updates"}."""
        loaded, client = self.engine.load_checkpoint(path, tag=CHECKPOINT_TAG, load_optimizer_states=True,
                                                     load_lr_scheduler_states=True)
        if loaded is None:
            raise FileNotFoundError(f"no learner checkpoint under {path}/{CHECKPOINT_TAG}")
        self.version, self.updates = int(client["version"]), int(client["updates"])
        return {"version": self.version, "updates": self.updates}

    def get_version(self) -> int:
        return self.version

    def peak_memory_mb(self) -> dict[str, float]:
        """Peak resident memory of this rank's process so far (and peak GPU memory allocated, on GPU)."""
        out = {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}  # Linux reports KiB
        if torch.cuda.is_available() and self.cfg.num_gpus_per_rank > 0:
            out["gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        return out

    def close(self) -> None:
        with self._publishing:
            if self.publisher is not None:
                self.publisher.close()
                self.publisher = None
