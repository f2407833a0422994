"""Evaluation: `python -m launch.eval` (the command) and what a training run's own evaluations share with it.

| module | what it is |
|---|---|
| `command` | the command: its options, the model and its untrained baseline, generators for each, then the runner |
| `runner` | the eval items through env pools with one policy, then the report; a training run calls it too |
| `report` | the report: figures per family and per level for each policy, as JSON and Markdown |

`__main__` only calls `command.main`. The runner and the report never import the command.
"""
