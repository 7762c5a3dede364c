"""TensorBoard event files under the run directory; a resumed run purges events after its step."""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from ..run_dir import RunDir


class TensorBoardTracker:
    def __init__(self, run_dir: RunDir, resume_step: Optional[int]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir.tensorboard_dir), purge_step=resume_step or None)

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = json.dumps(config, indent=2, sort_keys=False, default=str)
        self.writer.add_text("config", "```\n" + text + "\n```", global_step=0)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
