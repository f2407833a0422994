"""Typed config: structured dataclasses (one docstring per field), YAML recipes, one validation pass.

Imports nothing else from this project, and nothing heavy: the CLI validates a config before torch, Ray or
vLLM is imported.

| module | what it is |
|---|---|
| `schema` | the root of the config tree, `RootConfig`; each actor receives only its own section |
| `env` | the environments' sections (one per built-in family, the AgentGym HTTP client) and the env pools' |
| `generation` | the model, the vLLM generators and the multi-turn rollout loop |
| `learner` | the learner (DeepSpeed ZeRO) and the RL algorithm, the ScalingInter-RL horizon included |
| `run` | the run itself: coordinator, checkpoints, transport, logging, Ray and evaluation |
| `fields` | field helpers: a default plus the constraint it must satisfy (`spec`), and `ConfigError` |
| `load` | loading a YAML recipe, applying key=value overrides and validating everything once |
| `reference` | docs/configuration.md generated from the fields' docstrings (`python -m configs.reference`) |
"""
