"""What the three GPU checks run, below their commands (launch/gpu_check.py, launch/gpu_learner_check.py,
launch/gpu_device_check.py: each parses its options, calls these, and prints one JSON line). Nothing here imports
a command.

| module | command | what it is |
|---|---|---|
| `generator_steps` | gpu_check | the steps of one run in one dtype: sampling, logprobs, two updates under load |
| `generator_collective` | gpu_check | step `collective_update`: one version through the weights group |
| `reference` | gpu_check | the transformers forward pass the engine's logprobs are compared with |
| `compare` | gpu_check | perturbed weight versions and logprob differences, shared by the steps and the verdict |
| `verdict` | gpu_check | tolerances per dtype, the checks a run must pass, pass / retry / fail, the JSON line |
| `learner_cases` | gpu_learner_check | its cases (learn, fixed, ipc, throughput), each in a process of its own |
| `device_collective` | gpu_device_check | the weights group's bounded transfer on a device, into tensors made first |
"""
