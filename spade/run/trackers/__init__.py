"""Experiment trackers that ``MetricsWriter`` fans each step's metrics out to (``run.loggers``).

One module per tracker; each is imported only when the run chose it, so an uninstalled tracker
costs nothing unless asked for.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Mapping, Optional, Protocol

from ..run_dir import RunDir

# config name -> (module that must be importable, pip requirement that provides it)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb (requirements/trackers.txt)"),
    "mlflow": ("mlflow", "mlflow-skinny (requirements/trackers.txt)"),
}


class TrackerNotInstalled(RuntimeError):
    pass


class Tracker(Protocol):
    """One destination for a run's metrics (rank 0 only)."""

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def check_installed(names: tuple[str, ...]) -> None:
    """Raise before anything heavy starts when a chosen tracker's package is missing."""
    for name in names:
        module, requirement = TRACKERS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package (torch.utils) is missing
            found = False
        if not found:
            raise TrackerNotInstalled(f"run.loggers: {name!r} is chosen but {module!r} is not installed; "
                                      f"install {requirement} or remove {name!r} from run.loggers")


def open_tracker(name: str, run_dir: RunDir, resume_step: Optional[int]) -> Tracker:
    """``resume_step``: the step a resumed run continues from (metrics of later steps are dropped)."""
    if name == "tensorboard":
        from .tensorboard import TensorBoardTracker

        return TensorBoardTracker(run_dir, resume_step)
    if name == "wandb":
        from .wandb import WandbTracker

        return WandbTracker(run_dir, resume_step)
    if name == "mlflow":
        from .mlflow import MlflowTracker

        return MlflowTracker(run_dir, resume_step)
    raise ValueError(f"run.loggers: unknown tracker {name!r}; allowed: {', '.join(TRACKERS)}")
