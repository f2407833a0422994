"""Example env families written against the public interface only (core.env, environments.registry).

They are not built in: a run registers one by naming its module in the config, e.g.
`env.families={guess: environments.examples.guess}`; docs/add-an-environment.md walks through it.

| module | what it is |
|---|---|
| `guess` | the number-guessing game: the smallest complete env family (a package) |
| `workload` | a scripted workload family whose episodes' turns are set by the item, for benchmarks |
"""
