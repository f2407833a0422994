"""The commands a user runs, `python -m launch.<command>`, and below them what they run. Nothing below imports
a command (tests/test_layering.py).

| module | what it is |
|---|---|
| `train` | train: `python -m launch.train [--config X.yaml] [key=value ...]` |
| `eval/` | evaluate a model, a checkpoint or the random policy (`command`; its `runner` and `report`) |
| `results` | the default run, trained and evaluated, written to docs/results/ |
| `ablate/` | ablations (horizon, off-policy): variants x seeds, and their report |
| `bench/` | benchmarks: `python -m launch.bench <name>` |
| `splits` | write the generated train/test splits |
| `env_server` | serve an env family over AgentGym's env-server protocol |
| `soak_report` | is a long run flat? each role's memory and tokens/s after warm-up |
| `gpu_check`, `gpu_learner_check`, `gpu_device_check` | GPU checks: the generator, the learner, a device |
| `verify_install` | checks a freshly built venv (run by install.sh) |
| `job/` | the training job's wiring: Ray, placement, every role's actors, the session, what a run writes |
| `gpu/` | what the GPU checks run: their steps, reference, verdict and cases |

A role's process sends its output to its own log file from here on (core.role_log).

Ray reads its listening and authentication settings when it is *imported*, not when it starts, so the defaults
are set here, before any launch module can import Ray: a local Ray then listens on 127.0.0.1 only and checks
a token made for the run (launch.job.ray_cluster); a run that joins a cluster keeps that cluster's settings.
"""

# `python -m launch.X` puts the working directory on sys.path as "" (relative): pin the checkout's absolute
# path, because Ray's job runtime may change the directory while the driver starts.
import sys as _sys
from pathlib import Path as _Path

_ROOT = str(_Path(__file__).resolve().parents[1])
if _ROOT not in _sys.path:
    _sys.path.insert(0, _ROOT)

from core.role_log import capture_output as _capture_output  # noqa: E402
from launch.job.ray_cluster import apply_ray_env as _apply_ray_env  # noqa: E402

_capture_output()  # a role's process (e.g. a generator replica): its output goes to its log file

_apply_ray_env()
