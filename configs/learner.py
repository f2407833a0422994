"""Config of the learner (DeepSpeed ZeRO) and of the RL algorithm, including the ScalingInter-RL horizon."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from configs.fields import spec

CPU_AUTOCAST_CHOICES = ("auto", "none", "bfloat16")


@dataclass
class LearnerConfig:
    num_ranks: int = spec(1, ge=1)
    """Learner actors, one per data-parallel rank."""
    zero_stage: int = spec(2, choices=(1, 2, 3))
    """DeepSpeed ZeRO stage."""
    num_cpus_per_rank: float = spec(1.0, ge=0)
    """Ray CPU resource per rank."""
    num_gpus_per_rank: float = spec(0.0, ge=0)
    """Ray GPU resource per rank: 0 trains on CPU with gloo (the rank sees no GPU); a whole number >= 1
    trains on the first GPU Ray gives the rank, with NCCL. Fractions are refused: two ranks on one device
    fail in NCCL."""
    torch_threads: int = spec(0, ge=0)
    """Compute threads of a rank training on CPU; 0: its num_cpus_per_rank (at least 1), or the count of
    cpu_cores when those are set. More threads than reserved CPUs can pay when the generator idles while
    the learner trains."""
    cpu_autocast: str = spec("auto", choices=CPU_AUTOCAST_CHOICES)
    """Mixed precision for a rank training on CPU with model.dtype=float32: the forward and backward passes'
    matrix products in bfloat16 (on a CPU with AMX-BF16 or AVX512-BF16: forward and backward 1.7-2.0x
    faster, a training step about 1.25x; `auto` takes it only there, since a CPU without them emulates each
    bfloat16 product, many times slower than float32; an explicit `bfloat16` there is warned about), while the
    weights, the optimizer state and what the generators receive stay float32. The output layer runs in
    float32 (on the sampled positions only), so logprobs keep float32 precision up to the hidden states'
    rounding; the off-policy weights absorb the small gap to the generators' logprobs. Ignored on GPUs."""
    cpu_cores: list[int] = spec([])
    """Pin every rank's process to these core ids of its node (os.sched_setaffinity); empty: no pinning. For
    benchmarks that keep the learner and the generator (generator.cpu_threads_bind) on separate cores."""
    cpu_omp_wait_policy: str = spec("", choices=("PASSIVE", "ACTIVE", ""))
    """OMP_WAIT_POLICY of a rank training on CPU (set in its process before torch loads OpenMP). PASSIVE: its
    idle compute threads sleep between parallel regions instead of spinning, which can matter when it shares
    cores with the generator (trainer.admit_during_step); empty leaves the environment alone (OpenMP's own
    default). Not measured yet on the default: a knob to try, off."""
    lr: float = spec(1e-5, gt=0)
    """Peak learning rate."""
    warmup_steps: int = spec(0, ge=0)
    """Linear warmup steps."""
    lr_schedule: str = spec("constant", choices=("constant", "cosine", "linear"))
    """Decay after warmup."""
    lr_decay_steps: int = spec(0, ge=0)
    """Optimizer steps from the end of warmup to the end of the decay (cosine, linear); the learning rate
    stays at its floor afterwards. Required (> 0) when lr_schedule decays."""
    min_lr_ratio: float = spec(0.0, ge=0, le=1)
    """Floor of the decay, as a fraction of the peak learning rate."""
    weight_decay: float = spec(0.0, ge=0)
    """AdamW weight decay."""
    betas: list[float] = spec([0.9, 0.999])
    """AdamW betas."""
    grad_clip: float = spec(1.0, ge=0)
    """Global gradient-norm clip (0 disables)."""
    micro_batch_tokens: int = spec(8192, ge=1)
    """Token budget of one packed micro-batch per rank."""
    ppo_epochs: int = spec(1, ge=1)
    """Passes over each train batch."""
    mini_batches: int = spec(1, ge=1)
    """Optimizer steps per pass (the batch is split into this many mini-batches)."""
    fuse_proximal_pass: bool = spec(True)
    """With one optimizer step per batch (ppo_epochs = mini_batches = 1, GRPO-style advantages) the proximal
    policy is the current one, so the training forward's own detached logprobs serve and the separate no-grad
    pass is skipped (a quarter of a step's compute). False always runs the pass."""
    gradient_checkpointing: bool = spec(False)
    """Recompute activations in backward to save memory."""
    attn_implementation: str = spec("packed_sdpa", choices=("packed_sdpa", "sdpa", "eager", "flash_attention_2"))
    """Attention kernel. Micro-batches are packed rows whose position ids restart per sequence. packed_sdpa
    (core/packed_attention.py) runs PyTorch's causal sdpa on each sequence alone, without a mask; sdpa and eager
    keep the sequences apart with a dense mask over the whole row (attention 2.2 x slower on CPU for two
    sequences of 512 tokens); flash_attention_2 (GPU, the flash-attn package) by variable-length kernels."""
    seed: int = spec(0, ge=0)
    """Learner seed."""

    def validate(self) -> list[tuple[str, str]]:
        errors = []
        gpus = self.num_gpus_per_rank
        if gpus and (gpus < 1 or gpus != int(gpus)):
            errors.append(("num_gpus_per_rank", (f"expected 0 or a whole number >= 1, got {gpus:g}: ranks "
                                                 "sharing a GPU fail in NCCL (\"Duplicate GPU detected\")")))
        if self.lr_schedule != "constant" and self.lr_decay_steps == 0:
            errors.append(("lr_decay_steps", f"expected > 0 with lr_schedule={self.lr_schedule}"))
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            errors.append(("betas", f"expected two values in [0, 1), got {list(self.betas)}"))
        return errors


@dataclass
class RoundsCtrlConfig:
    """The reference's ScalingInter-RL keys, accepted as written."""

    type: str = spec("fixed", choices=("fixed", "scaling_inter_stepwise"))
    """`fixed`: always `rounds` turns. `scaling_inter_stepwise`: `rounds` is a list of turn limits, moving to the
    next every `steps_scaling_inter` learner steps."""
    rounds: Any = spec(20)
    """An int (fixed) or a list of ints (stepwise), e.g. [10, 20, 30]."""
    steps_scaling_inter: int = spec(100, ge=1)
    """Learner steps per stage for scaling_inter_stepwise."""


@dataclass
class HorizonConfig:
    """Native form of the turn schedule: turns[i] holds from step boundaries[i-1] (0 for i = 0)."""

    turns: list[int] = spec([], ge=1)
    """Turn limits per stage, e.g. [10, 20, 30]; empty defers to algorithm.rounds_ctrl."""
    boundaries: list[int] = spec([], ge=1)
    """Learner steps where each later stage begins, e.g. [100, 200]; one fewer than `turns`."""


@dataclass
class AlgorithmConfig:
    adv_estimator: str = spec("grpo", choices=("grpo", "rloo", "reinforce_pp", "gae"))
    """Advantage estimator feeding the decoupled PPO loss."""
    norm_adv_by_std: bool = spec(True)
    """GRPO: divide group-centred rewards by the group's std."""
    gamma: float = spec(1.0, ge=0, le=1)
    """Discount over turns (REINFORCE++, GAE); tokens of one reply are never discounted against each other."""
    lam: float = spec(1.0, ge=0, le=1)
    """GAE lambda, applied between turns like gamma."""
    clip_eps_low: float = spec(0.2, ge=0)
    """PPO ratio clip below 1 (current over proximal)."""
    clip_eps_high: float = spec(0.28, ge=0)
    """PPO ratio clip above 1 ("clip-higher")."""
    behaviour_weight_cap: float = spec(2.0, gt=0)
    """Truncation cap of the detached behaviour-to-proximal importance weight."""
    policy_loss: str = spec("decoupled", choices=("decoupled", "coupled"))
    """`decoupled`: decoupled PPO, the ratio clipped around the proximal policy (the learner's weights before
    the update) and the behaviour-to-proximal importance weight, truncated at behaviour_weight_cap: the
    off-policy correction. `coupled`: the same loss with the correction off, an ablation (`python -m launch.ablate
    offpolicy`): the behaviour policy's logprobs serve as the proximal ones, so the ratio is the standard PPO
    one, current over behaviour, and no importance weight is applied; the learner's proximal pass is skipped."""
    loss_agg: str = spec("token_mean", choices=("token_mean", "seq_mean_token_mean"))
    """How token losses are averaged."""
    entropy_coef: float = spec(0.0, ge=0)
    """Entropy bonus coefficient (0 disables)."""
    kl_coef: float = spec(0.0, ge=0)
    """KL penalty to a frozen reference model (0 disables, and no reference is loaded)."""
    kl_type: str = spec("k3", choices=("k1", "k2", "k3"))
    """KL estimator: k1 (log ratio), k2 (half squared log ratio), k3 (low-variance)."""
    value_clip: float = spec(0.2, ge=0)
    """Clip range of the value loss (gae only)."""
    value_coef: float = spec(0.5, ge=0)
    """Weight of the value loss (gae only)."""
    rounds_ctrl: RoundsCtrlConfig = spec(RoundsCtrlConfig())
    """ScalingInter-RL schedule in the reference's keys."""
    horizon: HorizonConfig = spec(HorizonConfig())
    """ScalingInter-RL schedule in native form; wins over rounds_ctrl when `turns` is set."""

    def validate(self) -> list[tuple[str, str]]:
        errors = []
        rc = self.rounds_ctrl
        rounds = rc.rounds
        as_list = list(rounds) if isinstance(rounds, (list, tuple)) or hasattr(rounds, "__iter__") else [rounds]
        if not as_list or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in as_list):
            errors.append(("rounds_ctrl.rounds", f"expected an int >= 1 or a non-empty list of them, got {rounds!r}"))
        elif rc.type == "fixed" and len(as_list) != 1:
            errors.append(("rounds_ctrl.rounds", "type=fixed takes a single int"))
        h = self.horizon
        if h.turns and len(h.boundaries) != len(h.turns) - 1:
            errors.append(("horizon.boundaries", f"expected {len(h.turns) - 1} entries for {len(h.turns)} turns"))
        if h.boundaries and any(b <= a for a, b in zip(h.boundaries, h.boundaries[1:])):
            errors.append(("horizon.boundaries", "expected strictly increasing steps"))
        if h.boundaries and not h.turns:
            errors.append(("horizon.turns", "expected turn limits to go with horizon.boundaries"))
        return errors
