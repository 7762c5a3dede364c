"""Where each step's metrics go: ``metrics.jsonl`` always, plus each tracker in ``run.loggers`` (rank 0)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from .progress import Progress
from .run_dir import RunDir
from .trackers import Tracker, TrackerNotInstalled, check_installed, open_tracker


class MetricsWriter:
    def __init__(self, run_dir: RunDir, purge_step: Optional[int], progress: Progress,
                 loggers: tuple[str, ...] = ("tensorboard",), config: Optional[Mapping[str, Any]] = None):
        self.run_dir = run_dir
        self.trackers: list[Tracker] = []
        for name in loggers:
            try:
                check_installed((name,))
            except TrackerNotInstalled as exc:
                if name != "tensorboard":
                    raise
                # the default tracker stays optional: a run without it still writes metrics.jsonl
                progress.message(f"warning: {exc}; writing metrics.jsonl only")
                continue
            tracker = open_tracker(name, run_dir, purge_step)
            if config is not None:
                tracker.log_config(config)
            self.trackers.append(tracker)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.run_dir.append_metrics({"step": step, **metrics})
        if not self.trackers:
            return
        scalars: dict[str, float] = {}
        for key, value in metrics.items():
            if isinstance(value, bool):
                value = float(value)
            if isinstance(value, (int, float)) and math.isfinite(float(value)):
                scalars[key] = float(value)
        for tracker in self.trackers:
            tracker.log(step, scalars)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
