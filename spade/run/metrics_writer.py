"""Where each step's metrics go: ``metrics.jsonl`` always, TensorBoard when it is installed (rank 0)."""

from __future__ import annotations

import math
from typing import Any, Optional

from .progress import Progress
from .run_dir import RunDir


class MetricsWriter:
    def __init__(self, run_dir: RunDir, purge_step: Optional[int], progress: Progress):
        self.run_dir = run_dir
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            progress.message(f"warning: TensorBoard is not available ({exc}); writing metrics.jsonl only")
            return
        self.tb = SummaryWriter(str(run_dir.tensorboard_dir), purge_step=purge_step)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.run_dir.append_metrics({"step": step, **metrics})
        if self.tb is not None:
            for key, value in metrics.items():
                if isinstance(value, bool):
                    value = float(value)
                if isinstance(value, (int, float)) and math.isfinite(float(value)):
                    self.tb.add_scalar(key, float(value), global_step=step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
