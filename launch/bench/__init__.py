"""Benchmarks: `python -m launch.bench <name> [options]`. Each prints a table and ends with one JSON line of
its figures. Ratios are measured side by side in one run, since these machines are noisy.

| module | what it is |
|---|---|
| `async`, `wholerun`, `tail` | the same training work, sync and async, over whole runs; its headline; its tail |
| `generator`, `hf_baseline` | generation throughput, weight-sync latency, multi-turn; HF `generate` baselines |
| `learner` | learner throughput and memory, ZeRO 1/2/3, 1 and 2 ranks |
| `transport`, `samples` | our ZeroMQ path against Ray's object store and memcpy; the records it sends |
| `fanout`, `netlab` | one weight version to 1-8 subscribers, relay and star; the shaped network it uses |
| `weights_shards` | the weight update as a run pays it, from ZeRO-3 shards to the replica's ack |
| `scale`, `_scale_roles` | the control plane at scale, with stand-ins for the model roles |
| `envs`, `envs_ii`, `solvers` | env throughput; SciWorld, Search, WebArena latency and memory; scripted solvers |
| `report` | the aligned table and the last JSON line every benchmark prints |
"""
