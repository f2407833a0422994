"""The training job's wiring: what `launch.train` (and the evaluation, benchmarks and checks that start roles)
uses to bring up Ray, start each role as a Ray actor where placement puts it, run the coordinator and write what
the run leaves behind. Commands (launch/*.py, launch/<command>/) import from here; nothing here imports a command.

| module | what it is |
|---|---|
| `cli` | the commands' shared parsing: --config, --print-config, --explain, key=value overrides |
| `stack_check` | before any role starts: can this config's kernels, compile mode and dtype run here? |
| `run` | the training run, start to end: Ray up, the session, then plot and evaluate |
| `session` | one training session: the roles it starts, what it resumes from, what it writes as it goes |
| `roles` | starting and stopping every role of a run (learners, generators, env pools), resource checks |
| `plan` | the placement plan: every role's actors, CPUs, GPUs, env and node, before anything starts |
| `placement` | what each role asks Ray for (bundles, options) and which GPUs its process may see |
| `learners` | the learner ranks as Ray actors, behind one handle |
| `generators` | the generator replicas as Ray actors |
| `generator_watch` | re-subscribes and republishes to a replica Ray restarted |
| `pools` | the env pools as Ray actors, and the supervisor that dispatches episodes to them |
| `ray_cluster` | Ray itself: the only `ray.init`, its listening and auth settings |
| `ray_log_filter` | the driver's filter on the raylet's repeated warnings |
| `stop` | stopping on SIGTERM/SIGINT within a grace period |
| `progress` | the progress bar, with the time of the evaluation after training |
| `role_stats` | each role's resident memory per step, and the driver's tokens/s |
| `episodes` | episodes kept for people to read: every evaluation's, a sample of training's |
| `wandb_sink` | wandb logging beside metrics.jsonl |
| `plot` | the run's PNG from metrics.jsonl |
| `local_shop` | the local WebArena shop a run serves itself (`env.webarena.tasks=local_shop`) |
"""
