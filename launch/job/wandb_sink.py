"""wandb logging (offline by default), beside the metrics.jsonl file every run writes.

The wandb run id is kept in the coordinator's checkpoint, so a resumed run continues the same wandb run.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from configs.load import to_dict
from configs.schema import RootConfig


def config_record(cfg: RootConfig) -> dict:
    """The resolved config as wandb records it, with the command line and the driver's pid."""
    record = to_dict(cfg)
    record["_argv"] = " ".join(sys.argv)
    record["_pid"] = os.getpid()
    return record


def run_sink(cfg: RootConfig, out: Path, run_id: str) -> "WandbSink | None":
    """The run's wandb sink (None when `logging.wandb_mode=disabled`); `run_id` continues a resumed run."""
    if cfg.logging.wandb_mode == "disabled":
        return None
    return WandbSink(cfg.logging.wandb_mode, cfg.logging.project, cfg.logging.run_name, out, config_record(cfg),
                     run_id=run_id or None)


class WandbSink:
    def __init__(self, mode: str, project: str, run_name: str, out_dir: str | Path, config: dict[str, Any],
                 run_id: str | None = None):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._wandb = wandb
        self.run = wandb.init(mode=mode, project=project, name=run_name or Path(out_dir).name,
                              dir=str(out_dir), config=config, id=run_id, resume="allow" if run_id else None,
                              settings=wandb.Settings(console="off", x_disable_stats=True))
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_episodes(self, step: int, records: list[dict]) -> None:
        """A sample of transcripts (launch/job/episodes.py) as the table `episodes` at `step`."""
        from launch.job.episodes import table_rows

        columns, rows = table_rows(records)
        self.run.log({"episodes": self._wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class FanOutSink:
    """Log to several sinks at once."""

    def __init__(self, *sinks):
        self.sinks = [s for s in sinks if s is not None]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
