"""Text environments behind one small async interface (core.env), grouped in families the registry finds by
name: built-in family `X` is the package `environments.X`, which exports `FAMILY`. Nothing here imports
actors or launch: only core, configs and environments itself.

| module | what it is |
|---|---|
| `registry` | env families by name: `Family`, built-in and configured (`env.families`) ones, `make_env` |
| `splits` | train/test item splits: the dataset's files when present, generated ones (seeded) otherwise |
| `item_sampler` | drawing training items by the env mix: a family by weight, then an item of its split |
| `unseen` | evaluation items no split contains, from a family's `unseen_items` hook |
| `preflight` | checks before any role starts: can every family of the mix run its items here? |
| `parsing` | one action out of a free-text reply: the reference's strict `Action:` rule and a lenient rule |
| `babyai` | BabyAI's levels over minigrid as text, with macro actions planned over the agent's view |
| `textcraft` | TextCraft: Minecraft crafting recipes, over our own game engine |
| `sciworld` | SciWorld: ScienceWorld's tasks, one bundled-simulator JVM per env |
| `searchqa` | Search-R1 style questions answered by searching a corpus (offline BM25 by default) |
| `webarena` | WebArena's tasks in Chromium through Playwright, and a local shop to run them against |
| `agentgym_http` | a client of AgentGym's HTTP env servers as a family, and a server that serves ours |
| `examples` | example families written against the public interface only, registered through the config |
"""
