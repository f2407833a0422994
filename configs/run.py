"""Config of the run itself: coordinator, checkpoints, transport, logging, Ray and evaluation."""
from __future__ import annotations

from dataclasses import dataclass

from configs.fields import spec


@dataclass
class TrainerConfig:
    total_steps: int = spec(40, ge=1)
    """Learner steps to run."""
    groups_per_step: int = spec(8, ge=1)
    """Item groups (each rollout.group_size samples) in one train batch."""
    max_staleness: int = spec(1, ge=0)
    """eta: a trajectory whose oldest sampled token is more than eta policy versions behind is not trained on,
    and generation never runs more than eta versions ahead. 0 is the synchronous mode."""
    batch_order: str = spec("completion", choices=("completion", "submission"))
    """Which complete groups make a batch: `completion`, the first to complete (no step waits for a straggler
    beyond its batch); `submission`, the next `groups_per_step` in the order they started, whatever their
    lengths (batches independent of timing, so runs with different eta train the same batches; a long episode
    never goes stale, at the cost of waiting for it)."""
    admit_during_step: bool = spec(True)
    """Start the groups the staleness gate allows while a step trains, not only between steps. The gate's
    version moves when the generators take a published version, mostly during the next step, so with false a
    step whose batch is complete at its start trains with the generators idle (with eta = 1, every other
    step). false suits a learner that takes the generators' cores while it trains (the 2-core default: a
    learner on both cores, slowed by a generator running beside it)."""
    seed: int = spec(0, ge=0)
    """Seed of the item sampler and everything the coordinator draws."""
    output_dir: str = spec("outputs/run")
    """Where checkpoints, logs, the plot and the eval report go."""
    max_failures: int = spec(3, ge=0)
    """Times a failed run (a learner rank died, every generator replica is gone, a channel broke) rebuilds its
    roles inside the job and continues from the last complete checkpoint; past that it stops, naming each
    cause. 0: stop at the first failure."""
    eval_every: int = spec(0, ge=0)
    """Evaluate every this many steps (0: only at the end, if eval.at_end)."""
    max_trained_turns: int = spec(0, ge=0)
    """Also stop once the trained batches have held this many turns in all (0: off; total_steps still caps
    the run). Horizon schedules compared at equal sampled turns use it (`python -m launch.ablate horizon`)."""


@dataclass
class CheckpointConfig:
    every_steps: int = spec(10, ge=0)
    """Checkpoint every this many steps (0: only at the end and on SIGTERM or SIGINT)."""
    keep_last: int = spec(2, ge=1)
    """Complete checkpoints kept; older ones are deleted."""
    resume: str = spec("")
    """`` (start fresh), `auto` (the newest checkpoint in output_dir that verifies, if any) or a checkpoint
    path."""
    stop_grace_s: float = spec(30.0, gt=0)
    """On SIGTERM or SIGINT the run saves its state and exits within this many seconds (past it, it exits
    without a new checkpoint; a second signal exits at once)."""


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (the same test as core.transport.is_loopback)."""
    return host == "localhost" or host.startswith("127.") or host in ("::1", "[::1]")


@dataclass
class TransportConfig:
    host: str = spec("127.0.0.1")
    """Interface the ZMQ endpoints bind to. Loopback unless set; multi-node runs name the node's interface
    (or 0.0.0.0) here."""
    trajectory_port: int = spec(0, ge=0, le=65535)
    """Port of the coordinator's trajectory receiver (0: a free port)."""
    weights_port: int = spec(0, ge=0, le=65535)
    """Port of the learner's weights publisher (0: a free port)."""
    hwm: int = spec(64, ge=1)
    """High-water mark (messages) of the trajectory channel on each end."""
    same_node: bool = spec(True)
    """Env pools on the coordinator's node send their trajectories over a Unix socket (ipc://, in a directory only
    the run's user may enter) instead of TCP: about twice the throughput for 1 MB records here, and no CURVE to
    pay there. Pools on other nodes use `host` as before."""
    weights_chunk_mb: int = spec(4, ge=1, le=1024)
    """Largest chunk of the weights channel (small chunks keep the receiver's buffers recycled)."""
    weights_ack_timeout_s: float = spec(300.0, gt=0)
    """How long the learner waits for every generator to acknowledge a weight version."""
    weights_bucket_mb: int = spec(512, ge=1, le=1024)
    """With weights_sync=collective: the largest bucket a version moves in (a larger tensor fills one alone).
    Rank 0 and each replica's workers hold two such buffers while a version moves, never the whole version."""
    weights_stall_timeout_s: float = spec(60.0, gt=0)
    """A generator that takes no chunk of a weight version for this long is skipped for that version (named in
    the log and in transport/weights_stalled), so that it cannot hold up the others."""
    weights_fanout: str = spec("relay", choices=("relay", "star"))
    """How a weight version reaches the generator replicas. `relay`: the learner sends each chunk once, to the
    first replica of a chain, and each replica forwards every chunk to the next as soon as it has it (a version
    reaches N replicas in about one transfer time plus N chunk latencies, and the learner's cost does not grow
    with N); a replica that dies or stalls is re-linked around within weights_stall_timeout_s. Each replica then
    binds one more port on `host` (a free one), authenticated like the other channels. `star`: the learner sends
    every chunk to every replica."""
    weights_shm: bool = spec(True)
    """With weights_sync=zmq, replicas on learner rank 0's node take each version from its shared memory
    (/dev/shm) instead of TCP, and their vLLM engines load it from there: one copy instead of a send, a receive
    and a staging copy. A replica qualifies by reading a random token the learner put in its memory (so another
    node, container or user cannot); the others, and any version for which both of the learner's two slots are
    still being read, go over TCP. Costs two copies of the weights (model.dtype) in that node's /dev/shm."""
    weights_sync: str = spec("zmq", choices=("zmq", "collective"))
    """How weight versions travel from learner rank 0 to the generator replicas. `zmq`: through host memory over
    the ZeroMQ weights channel (weights_fanout, CURVE off loopback). `collective`: rank 0 and every replica's vLLM
    worker(s) form a process group of their own (its store on weights_port at `host`); each version's names and
    shapes are announced there, then every tensor is broadcast in the engines' dtype (model.dtype) straight into
    the workers: NCCL from GPU to GPU, gloo on CPU; when every worker sees rank 0's GPU (one node) it copies
    from rank 0's memory through CUDA IPC instead. Neither the group's store nor NCCL or gloo is authenticated:
    off loopback this needs allow_insecure (a trusted cluster network). A replica that Ray restarts cannot rejoin
    the group: the run rebuilds its roles (trainer.max_failures)."""
    auth: str = spec("auto", choices=("auto", "curve", "off"))
    """ZeroMQ CURVE on the trajectory and weights channels (keys made per run, held in memory): `auto` uses it
    whenever `host` is not loopback; `curve` always; `off` never (off loopback this needs allow_insecure)."""
    cipher: str = spec("aes-gcm", choices=("aes-gcm", "curvezmq"))
    """How the trajectory and weights channels encrypt when they have the run's keys (auth). `aes-gcm`: the
    sending and the receiving thread seal and open each message themselves (AES-256-GCM, keys derived from the
    same per-run CURVE key pairs, core/seal.py, core/weights/seal.py; a weights chunk is sealed once and relayed
    sealed): here about 1.6 times CurveZMQ's throughput on 1 MB records and 1.8 times on weights; outsiders can
    connect, and each of their messages is refused before any decoder (transport/auth_refused,
    transport/weights_auth_refused). `curvezmq`: ZeroMQ's own CURVE handshake refuses outsiders' connections,
    and its I/O thread encrypts."""
    allow_insecure: bool = spec(False)
    """For a trusted cluster network only: allows what leaves a part of the run open to anyone who reaches its
    ports off loopback: `auth=off` on a non-loopback host (they can push trajectories and read the model),
    `weights_sync=collective` there (its store, NCCL and gloo are not authenticated), learner ranks spread over
    several nodes (they rendezvous through torch's TCPStore and run gloo or NCCL unauthenticated; without this
    the ranks are kept on one node), and joining a Ray cluster without Ray's token authentication
    (RAY_AUTH_MODE=token), whose ports give the run's keys and code execution as the run's user. All but
    collective are also named in a warning at start."""

    def uses_curve(self) -> bool:
        return self.auth == "curve" or (self.auth == "auto" and not is_loopback(self.host))

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.weights_sync == "collective" and not is_loopback(self.host) and not self.allow_insecure:
            problems.append(("weights_sync", f"weights_sync=collective with host={self.host} sends the model over an "
                             "unauthenticated process group (TCPStore, NCCL or gloo); use weights_sync=zmq, or set "
                             "transport.allow_insecure=true on a trusted cluster network"))
        if self.auth == "off" and not is_loopback(self.host) and not self.allow_insecure:
            problems.append(("auth", f"auth=off with host={self.host} leaves the trajectory and weights channels open "
                             "to anyone on the network, who could push forged trajectories and read the model; use "
                             "auth=auto (CURVE keys made per run), or set transport.allow_insecure=true"))
        return problems


@dataclass
class LoggingConfig:
    wandb_mode: str = spec("offline", choices=("offline", "online", "disabled"))
    """wandb mode; offline writes under output_dir/wandb."""
    project: str = spec("agentgym-rl")
    """wandb project."""
    run_name: str = spec("")
    """wandb run name (empty: derived from output_dir)."""
    progress_bar: bool = spec(True)
    """Show the progress bar."""
    verbose: bool = spec(False)
    """Show every role's own output (vLLM, Ray, DeepSpeed, per-episode lines) in the terminal; by default it
    goes to `<output_dir>/logs/<role>.log` and the terminal shows the progress bar, warnings and errors.
    `--verbose` on the command line sets it."""
    log_every: int = spec(1, ge=1)
    """Log metrics every this many steps."""
    episodes_every: int = spec(5, ge=0)
    """Keep a sample of the trained episodes' transcripts (each turn's observation, reply, parsed action and
    reward, and how the episode ended; decoded from the tokens for reading only) every this many steps, in
    `<output_dir>/episodes.jsonl` and, with wandb on, as the table `episodes` (0: none)."""
    episodes_per_sample: int = spec(4, ge=0)
    """Episodes in each sample (failures and successes alternating)."""
    episodes_max_mb: float = spec(16.0, ge=0)
    """Cap on `episodes.jsonl` of a training run; once reached no more samples are kept (the metric
    `episodes/skipped` counts them)."""


@dataclass
class RayConfig:
    address: str = spec("")
    """Ray cluster address; empty uses RAY_ADDRESS, or starts a local Ray on loopback."""
    num_cpus: int = spec(0, ge=0)
    """CPUs of a local Ray (0: all of this machine's)."""
    namespace: str = spec("agentgym-rl")
    """Ray namespace of the run's actors."""


@dataclass
class EvalConfig:
    split: str = spec("test", choices=("train", "test"))
    """Split to evaluate."""
    envs: list[str] = spec(["babyai"], nonempty=True)
    """Env families to evaluate."""
    limit: int = spec(0, ge=0)
    """Evaluate only the first N items of each split (0: all)."""
    samples: int = spec(1, ge=1)
    """Samples per item (k)."""
    temperature: float = spec(0.0, ge=0)
    """0 is greedy."""
    resample_repeats: int = spec(0, ge=0)
    """When the model's reply to an observation repeats one it already gave to the same observation in the
    episode, sample again at eval.resample_temperature, up to this many times, until one differs (0: off).
    In a deterministic env the same reply to the same observation does the same thing, so a greedy agent that
    got nowhere with it would repeat it to the turn limit. Model rows only: the random policy is left as it
    is."""
    resample_temperature: float = spec(1.0, gt=0)
    """The temperature of those samples (eval.resample_repeats)."""
    max_turns: int = spec(0, ge=0)
    """Turn limit during eval (0: the family's reference limit)."""
    long_max_turns: int = spec(0, ge=0)
    """A second turn limit the end-of-run evaluation also runs at, on the same items and with the same baselines,
    into `<output_dir>/eval-<N>-turns/` (0: none). Set above the training horizon, it shows whether the trained
    agent turns more turns into more successes."""
    at_end: bool = spec(True)
    """Run an evaluation when training ends."""
    item_set: str = spec("split", choices=("split", "unseen"))
    """Items to evaluate: `split` (eval.split's items) or `unseen` (BabyAI: ids in no train or test split, of the
    levels of env.babyai.levels; eval.limit of them, 0: 30 per level)."""
    baselines: bool = spec(True)
    """Report baselines next to the model on the same items: the random policy (cheap, no model) and the untrained
    model (a training run evaluates its base weights before its first step: one more evaluation's generation)."""
