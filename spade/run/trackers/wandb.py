"""Weights & Biases: one W&B run per spade run, resumed by the id kept in the run directory.

Offline mode (``WANDB_MODE=offline``) writes under ``RUN/wandb/`` and is synced later with
``wandb sync``. On resume the run continues with ``resume="allow"`` and the same id; W&B keeps
a step's first value and ignores logs at steps it already has, so steps re-run after the
checkpoint are logged again only when W&B has not seen them (in offline mode each resume is a
new local file that ``wandb sync`` merges into the same run).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..run_dir import RunDir
from .run_id import read_id, write_id


class WandbTracker:
    def __init__(self, run_dir: RunDir, resume_step: Optional[int]):
        import wandb

        run_id = read_id(run_dir, "wandb")  # None: W&B picks a new id, kept below
        self.resume_step = resume_step or 0
        self.run = wandb.init(dir=str(run_dir.root), id=run_id, name=run_dir.root.name,
                              resume="allow", settings=wandb.Settings(console="off", x_disable_stats=True))
        write_id(run_dir, "wandb", self.run.id)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() can return before W&B's service has closed the run's file (seen under load: the
        # offline file of a resumed run still lacked its history); teardown waits for the service
        wandb.teardown()
