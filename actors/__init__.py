"""The run's roles as Ray actors. A role's process sends its output to its log file from the first import
of this package (core.role_log), before any library prints.

| module | what it is |
|---|---|
| `coordinator` | the coordinator: admits episodes, assembles groups, trains, publishes weights, logs, checkpoints |
| `env_pool` | the env pool: whole episodes in a fixed number of concurrent slots, trajectories shipped over ZMQ |
| `generator` | the generator: one vLLM `AsyncLLM` engine serving token-in/token-out requests, weights in place |
| `learner` | one learner rank: a DeepSpeed ZeRO engine training the policy with decoupled PPO |
| `policy_client` | the `Policy` env pools use: requests routed over the generator replicas, sessions kept together |
| `random_policy` | the random baseline as a `Policy`: one of the actions the env lists, chosen uniformly |
| `episode_summary` | the small record an env pool returns for each episode |
| `episode_watch` | stopping a run whose episodes keep failing, naming the family and the failing side |
| `group_buffer` | the samples of each item assembled into whole groups, in completion or start order |
| `seat_pool` | the generator's engine seats, handed out by group age, held briefly for an episode's next turn |
| `session_slots` | admission of episodes to one generator, sized so their prefixes stay in the KV cache |
| `owner_watch` | a process that exits when its owner does: the vLLM engine core ends with its generator |
| `update_gate` | holding a generator's requests while a weight update runs, the same on every supported vLLM |
| `zero_engine` | DeepSpeed plumbing for the learner: process group, ZeRO engine, small collectives, full weights |
| `weights` | getting the learner's weights into every replica's vLLM in place: the torch ends (a package) |
"""
from core.role_log import capture_output as _capture_output

_capture_output()
