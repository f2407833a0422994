"""Ablations: `python -m launch.ablate horizon|offpolicy` trains the same model on the same items under a few
variants, several seeds each, and writes a report of how they compare.

| module | what it is |
|---|---|
| `command` | the command: picks the ablation and hands it the rest of the arguments |
| `runs` | what both share: the options, one `launch.train` per variant and seed, evaluations of kept checkpoints |
| `horizon` | the horizon ablation: fixed short, fixed long and ScalingInter-RL turn schedules |
| `horizon_report` | its Markdown page and PNG, and the report helpers the off-policy report shares |
| `offpolicy` | the off-policy ablation: decoupled PPO with and without its correction, and eta = 0 |
| `offpolicy_report` | its Markdown page and PNG |

`__main__` only calls `command.main`. Nothing else here imports the command.
"""
