"""MLflow: one MLflow run per spade run, resumed by the id kept in the run directory.

The tracking URI is MLflow's own (``MLFLOW_TRACKING_URI``; a local ``file:`` store or a server).
On resume the same run is reopened and metrics of steps after the checkpoint are deleted from
the history before the re-run logs them again (MLflow appends, it has no purge).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import urlparse
from typing import Any, Mapping, Optional

from ..run_dir import RunDir
from .run_id import read_id, write_id

_PARAM_LIMIT = 6000  # MLflow's longest param value


def metric_key(key: str) -> str:
    """MLflow allows letters, digits, ``_ - . /`` and spaces in names; anything else becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", key)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = (value if isinstance(value, str) else json.dumps(value, default=str))[:_PARAM_LIMIT]
    return out


class MlflowTracker:
    def __init__(self, run_dir: RunDir, resume_step: Optional[int]):
        import mlflow
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        run_id = read_id(run_dir, "mlflow")
        if run_id is None:
            experiment = mlflow.set_experiment("spade")
            run = self.client.create_run(experiment.experiment_id, run_name=run_dir.root.name)
            run_id = run.info.run_id
            write_id(run_dir, "mlflow", run_id)
        else:
            self.client.update_run(run_id, status="RUNNING")
            if resume_step is not None:
                self._drop_after(run_id, resume_step)
        self.run_id = run_id
        self.resumed = resume_step is not None

    def _drop_after(self, run_id: str, resume_step: int) -> None:
        """Drop steps >= ``resume_step`` (they run again); the file store keeps each metric's
        history as an append-only ``timestamp value step`` file, rewritten here without them."""
        run = self.client.get_run(run_id)
        uri = run.info.artifact_uri or ""
        if not uri.startswith("file:"):
            return  # a server store: the re-run steps are appended beside the old ones
        metrics_dir = Path(urlparse(uri).path).parent / "metrics"
        for path in metrics_dir.rglob("*"):
            if path.is_file():
                kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                        if line.strip() and int(line.split()[2]) < resume_step]
                path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = _flatten(config)
        if self.resumed:  # params are immutable in MLflow and were logged by the first run
            existing = self.client.get_run(self.run_id).data.params
            params = {k: v for k, v in params.items() if k not in existing}
        items = [Param(k, v) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start:start + 100])

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_key(key), value, now, step) for key, value in scalars.items()]
        for start in range(0, len(metrics), 500):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 500])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
