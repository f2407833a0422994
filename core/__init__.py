"""Pure building blocks: wire types and codec, ZeroMQ transport, env and policy interfaces, horizon schedule,
advantages, loss, staleness gate, checkpoint layout. Never imports ray, vllm or deepspeed.

| module | what it is |
|---|---|
| `trajectory` | the record an env pool sends for one episode, its invariants (`validate`), and `WireError` |
| `codec` | msgpack encoding of a trajectory: a header checked field by field, per-token arrays as raw frames |
| `transport` | the ZeroMQ trajectory channel: env-pool senders, one coordinator receiver, bad messages dropped |
| `curve` | CurveZMQ for the run's channels: per-run keys, and the ZAP handler that admits only the run's clients |
| `admission` | the handshake (a token made from the run's keys) a sealed listener asks before any message |
| `seal` | AES-256-GCM sealing of messages under the run's key pairs: sender, order and replays checked |
| `weights` | the weights channel over ZeroMQ, learner rank 0 to every generator replica (a package) |
| `env` | the env interface every family implements (reset, step, close), and the worker thread of blocking envs |
| `policy` | what the rollout loop asks of a policy: token ids in, sampled ids with logprobs and versions out |
| `chat` | token-level chat formatting: the template rendered once, every later piece appended |
| `tokenizer_load` | a tokenizer loaded by its class name, as AutoTokenizer would, without importing torch |
| `rollout` | the multi-turn agent loop: one episode of reset, generate, step, ... emitted as one `Trajectory` |
| `scripted_policy` | a policy that writes scripted replies instead of sampling them, for tests and env benchmarks |
| `transcript` | an episode as turns of text a person can read, decoded from the record's tokens |
| `sampler` | which item the next group trains on: a weighted env mix over per-env items, a resumable cursor |
| `horizon` | ScalingInter-RL: the turns an episode may take, a pure function of the learner step |
| `staleness` | the staleness bound: admission of groups to generation, and the freshness filter of training |
| `advantages` | the advantage estimators (GRPO, RLOO, REINFORCE++, GAE): one advantage per sampled token |
| `batching` | from trajectories to the learner's padding-free packed micro-batches, balanced by tokens |
| `token_scorer` | the causal LM (and optional value head) that scores a packed micro-batch |
| `packed_attention` | attention over a packed row one sequence at a time (`attn_implementation="packed_sdpa"`) |
| `loss` | decoupled PPO: the policy loss, its optional terms, and the statistics the learner reports |
| `lr_schedule` | the learning-rate schedule, a pure function of the optimizer step: warmup, then hold or decay |
| `checkpoint` | the checkpoint layout: temporary folder, fsync, a manifest marker written last, rename; verify |
| `models` | `model.path` resolved to a local Hugging Face folder (the default converted once); trained weights saved |
| `metrics` | metric names and namespaces, the JSONL sink, and the rollout summary of a batch |
| `stats` | the Wilson confidence interval of the rates an evaluation reports |
| `cue_task` | a toy multi-turn task with a verifiable reward, and plain torch sampling, for the learner's tests |
| `tiny_model` | a tiny random Llama with a real byte-level BPE tokenizer and a ChatML template, built in seconds |
| `role_log` | per-role log files: a role's process prints to its own file, only warnings reach the terminal |
| `heap` | the start-up heap frozen out of the cyclic collector in long-lived roles; the collector's time |
| `cpu_affinity` | pinning a role's process to CPU cores; glibc kept from giving freed memory back |
| `cpu_features` | whether this CPU multiplies bfloat16 natively, which decides `learner.cpu_autocast=auto` |
"""
