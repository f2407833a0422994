"""Decoupled PPO: the policy loss, its optional terms, and the statistics the learner reports.

Three policies, always named so:
- behaviour: the policy that sampled the tokens (its logprobs travel in the trajectory; possibly stale);
- proximal: the learner's weights before this update (logprobs recomputed by the learner, no grad);
- current: the weights being optimised (logprobs with grad).

Per sampled token, with advantage A:

    ratio  = exp(logp_current - logp_proximal)
    weight = min(exp(logp_proximal - logp_behaviour), cap)              detached, truncated at `cap`
    policy loss = -weight * min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)

With behaviour == proximal the weight is 1 and this is standard clipped PPO (with clip-higher when
eps_high > eps_low). `policy_loss="coupled"` is that loss whatever the proximal policy: the behaviour
logprobs serve as the proximal ones, so the ratio is exp(logp_current - logp_behaviour), clipped around the
behaviour policy, and there is no importance weight (the off-policy correction switched off, for the
ablation `python -m launch.ablate offpolicy`; the learner then skips its proximal pass).

Optional terms, per token, aggregated the same way: `- entropy_coef * entropy`,
`+ kl_coef * KL(current || reference)` by the k1/k2/k3 estimator, and `+ value_coef * clipped value loss`
0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2).

Aggregation is by per-token weights (`token_weights`) given by the caller, so that one loss can be split over
micro-batches and ranks and still sum to the mini-batch's mean: token mean gives each sampled token of the
mini-batch weight 1 / (its sampled tokens, all ranks); the sequence mean of token means gives a token of
sequence s weight 1 / (tokens of s * sequences in the mini-batch). `aggregation_weights` computes them.

Statistics are returned as sums over the tokens given (plus maxima), so the learner can add them over
micro-batches and ranks before dividing; `finish_stats` turns the sums into the reported means.
All tensors here are 1-D over the sampled tokens of a micro-batch: shape [n].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

KL_TYPES = ("k1", "k2", "k3")
POLICY_LOSSES = ("decoupled", "coupled")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean")


@dataclass(frozen=True)
class LossSettings:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    behaviour_weight_cap: float = 2.0
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_type: str = "k3"
    value_clip: float = 0.2
    value_coef: float = 0.5
    policy_loss: str = "decoupled"  # or "coupled": behaviour logprobs as the proximal ones, no importance weight

    def __post_init__(self):
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(f"policy_loss: expected one of {POLICY_LOSSES}, got {self.policy_loss!r}")
        if self.kl_type not in KL_TYPES:
            raise ValueError(f"kl_type: expected one of {KL_TYPES}, got {self.kl_type!r}")
        if self.behaviour_weight_cap <= 0:
            raise ValueError(f"behaviour_weight_cap: expected > 0, got {self.behaviour_weight_cap}")
        if self.clip_eps_low < 0 or self.clip_eps_high < 0:
            raise ValueError("clip_eps_low and clip_eps_high must be >= 0")


# Sums over tokens (divide by "tokens") and maxima (reduced with max across micro-batches and ranks).
SUM_KEYS = ("tokens", "policy_loss", "clip_frac", "clip_low_frac", "clip_high_frac", "approx_kl",
            "is_weight_mean", "truncated_frac", "entropy", "kl_ref", "value_loss", "value_clip_frac")
MAX_KEYS = ("is_weight_max",)


def aggregation_weights(seq_token_count: torch.Tensor, mode: str, total_tokens: float,
                        total_sequences: float) -> torch.Tensor:
    """Per-token loss weights [n] for `mode`, given each token's sequence length in sampled tokens [n] and the
    mini-batch's totals over all micro-batches and ranks."""
    if mode == "token_mean":
        return torch.full_like(seq_token_count, 1.0 / max(total_tokens, 1.0), dtype=torch.float32)
    if mode == "seq_mean_token_mean":
        return 1.0 / (seq_token_count.float() * max(total_sequences, 1.0))
    raise ValueError(f"loss_agg: expected one of {AGGREGATIONS}, got {mode!r}")


def kl_penalty(current: torch.Tensor, reference: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token estimate of KL(current || reference) from sampled tokens' logprobs.
    k1 = log(p/q); k2 = 0.5 * log(p/q)^2; k3 = q/p - 1 - log(q/p) (unbiased, low variance, >= 0)."""
    log_ratio = current - reference
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return 0.5 * log_ratio.square()
    if kl_type == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"kl_type: expected one of {KL_TYPES}, got {kl_type!r}")


def behaviour_weights(proximal: torch.Tensor, behaviour: torch.Tensor,
                      cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(truncated weight, raw weight): exp(proximal - behaviour), the truncated one capped at `cap`."""
    raw = torch.exp(proximal - behaviour)
    return torch.clamp(raw, max=cap), raw


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, with grad: this micro-batch's share of the mini-batch loss
    sums: dict[str, float]  # SUM_KEYS over this micro-batch's tokens
    maxima: dict[str, float]  # MAX_KEYS


def decoupled_ppo_loss(current: torch.Tensor, proximal: torch.Tensor, behaviour: torch.Tensor,
                       advantages: torch.Tensor, token_weights: torch.Tensor, settings: LossSettings, *,
                       entropy: torch.Tensor | None = None, reference: torch.Tensor | None = None,
                       values: torch.Tensor | None = None, old_values: torch.Tensor | None = None,
                       returns: torch.Tensor | None = None) -> LossOutput:
    """The loss of one micro-batch. current/proximal/behaviour are logprobs of the sampled tokens [n];
    `token_weights` [n] come from `aggregation_weights` (0 for padding tokens that must not count). With
    `settings.policy_loss == "coupled"` the proximal logprobs are not used (the behaviour ones take their place)."""
    s = settings
    if s.policy_loss == "coupled":
        proximal = behaviour
    proximal, behaviour, advantages = proximal.detach(), behaviour.detach(), advantages.detach()
    counted = (token_weights > 0).float()

    ratio = torch.exp(current - proximal)
    if s.policy_loss == "coupled":  # no correction: a weight of 1, whatever the cap (a cap below 1 would scale)
        raw_weight = torch.ones_like(behaviour)
        weight = raw_weight
    else:
        weight, raw_weight = behaviour_weights(proximal, behaviour, s.behaviour_weight_cap)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - s.clip_eps_low, 1.0 + s.clip_eps_high) * advantages
    policy_token = -weight * torch.minimum(unclipped, clipped)
    total = policy_token
    if entropy is not None and s.entropy_coef > 0:
        total = total - s.entropy_coef * entropy
    kl = None
    if reference is not None:
        kl = kl_penalty(current, reference.detach(), s.kl_type)
        if s.kl_coef > 0:
            total = total + s.kl_coef * kl
    value_token = None
    if values is not None:
        if old_values is None or returns is None:
            raise ValueError("the value loss needs old_values and returns with values")
        old_values, returns = old_values.detach(), returns.detach()
        values_clipped = old_values + torch.clamp(values - old_values, -s.value_clip, s.value_clip)
        err, err_clipped = (values - returns).square(), (values_clipped - returns).square()
        value_token = 0.5 * torch.maximum(err, err_clipped)
        total = total + s.value_coef * value_token
    loss = (token_weights * total).sum()

    with torch.no_grad():
        def tsum(x: torch.Tensor) -> float:
            return float((counted * x.float()).sum())

        active_clip = (clipped < unclipped).float()  # the clipped branch is the min: no gradient flows
        low = (ratio < 1.0 - s.clip_eps_low) & (advantages < 0)
        high = (ratio > 1.0 + s.clip_eps_high) & (advantages > 0)
        log_ratio = current.detach() - proximal
        sums = {
            "tokens": float(counted.sum()),
            "policy_loss": tsum(policy_token.detach()),
            "clip_frac": tsum(active_clip),
            "clip_low_frac": tsum(low.float()),
            "clip_high_frac": tsum(high.float()),
            "approx_kl": tsum(torch.expm1(log_ratio) - log_ratio),  # k3 of KL(proximal || current)
            "is_weight_mean": tsum(raw_weight),
            "truncated_frac": tsum((raw_weight > s.behaviour_weight_cap).float()) if s.policy_loss == "decoupled"
            else 0.0,
            "entropy": tsum(entropy.detach()) if entropy is not None else 0.0,
            "kl_ref": tsum(kl.detach()) if kl is not None else 0.0,
            "value_loss": tsum(value_token.detach()) if value_token is not None else 0.0,
            "value_clip_frac": tsum((err_clipped > err).float()) if value_token is not None else 0.0,
        }
        present = counted > 0
        maxima = {"is_weight_max": float(raw_weight[present].max()) if bool(present.any()) else 0.0}
    return LossOutput(loss=loss, sums=sums, maxima=maxima)


def finish_stats(sums: dict[str, float], maxima: dict[str, float]) -> dict[str, float]:
    """Means over tokens from the summed statistics (all micro-batches, all ranks)."""
    n = max(sums.get("tokens", 0.0), 1.0)
    out = {k: v / n for k, v in sums.items() if k != "tokens"}
    out["tokens"] = sums.get("tokens", 0.0)
    out.update(maxima)
    return out
