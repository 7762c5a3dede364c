"""run.loggers: W&B (offline) and MLflow (local file store) get metrics.jsonl's numbers and the
config, and a resumed run continues the same tracker run without duplicated steps. No network.

wandb / mlflow-skinny come from requirements/trackers.txt; the tests skip when they are absent.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from spade.config import ConfigError
from spade.run.metrics_writer import MetricsWriter
from spade.run.progress import Progress
from spade.run.run_dir import RunDir
from spade.run.trackers import TrackerNotInstalled, check_installed
from spade.train_config import RunSection, from_dict

CONFIG = {"run": {"steps": 4, "seed": 7}, "loss": {"kl_coef": 0.01}}


def _steps(first: int, last: int) -> dict[int, dict[str, float]]:
    # values chosen by hand, distinct per step and key, one key with a character MLflow refuses
    return {s: {"reward/mean": 0.25 * s, "loss": 1.0 / s, "acc@1": float(s % 2), "ok": s > 1}
            for s in range(first, last + 1)}


def _run(tmp_path: Path, loggers: tuple[str, ...]) -> RunDir:
    """Steps 1-3, then a 'kill' after a checkpoint at step 2 and a resume that runs 2-4 again."""
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    progress = Progress(4, enabled=False)
    writer = MetricsWriter(run_dir, purge_step=None, progress=progress, loggers=loggers, config=CONFIG)
    for step, metrics in _steps(1, 3).items():
        writer.write(step, metrics)
    writer.close()
    run_dir.truncate_metrics(2)  # what Trainer.restore does
    writer = MetricsWriter(run_dir, purge_step=2, progress=progress, loggers=loggers, config=CONFIG)
    for step, metrics in _steps(2, 4).items():
        writer.write(step, {k: v + 100 for k, v in metrics.items()})  # the re-run's values differ
    writer.close()
    return run_dir


def _expected(run_dir: RunDir) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for record in run_dir.read_metrics():
        for key, value in record.items():
            if key != "step":
                out.setdefault(key, {})[record["step"]] = float(value)
    return out


def test_unknown_logger_is_refused_naming_key_and_allowed():
    with pytest.raises(ConfigError, match=r"run\.loggers.*'neptune'.*tensorboard, wandb, mlflow"):
        from_dict({"run": {"loggers": ["tensorboard", "neptune"]}})
    assert RunSection().loggers == ("tensorboard",)


def test_missing_tracker_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(TrackerNotInstalled, match=r"run\.loggers: 'wandb'.*requirements/trackers\.txt"):
        check_installed(("wandb",))


def test_metrics_jsonl_reference_of_the_resume(tmp_path):
    run_dir = _run(tmp_path, ())
    assert [r["step"] for r in run_dir.read_metrics()] == [1, 2, 3, 4]
    assert _expected(run_dir)["loss"] == {1: 1.0, 2: 100.5, 3: 100 + 1 / 3, 4: 100.25}


def test_mlflow_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (requirements/trackers.txt)")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3.x: the file store is opt-in
    run_dir = _run(tmp_path, ("mlflow",))
    run_id = (run_dir.root / "mlflow_run_id").read_text().strip()
    client = MlflowClient(tracking_uri=uri)
    assert len(client.search_runs([client.get_experiment_by_name("spade").experiment_id])) == 1
    for key, by_step in _expected(run_dir).items():
        history = client.get_metric_history(run_id, key.replace("@", "_"))
        assert sorted((m.step, m.value) for m in history) == sorted(by_step.items()), key
    params = client.get_run(run_id).data.params
    assert params["run.steps"] == "4" and params["loss.kl_coef"] == "0.01"
    assert client.get_run(run_id).info.status == "FINISHED"


def _wandb_records(path: Path):
    """Records of a ``.wandb`` transaction log (LevelDB log framing of wandb's own protobuf
    ``Record``; wandb 0.31 ships no Python reader, its Go core reads these files)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (kind == 0 and length == 0):
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (requirements/trackers.txt)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = _run(tmp_path, ("wandb",))
    run_id = (run_dir.root / "wandb_run_id").read_text().strip()
    # W&B names a second offline directory of the same second and id with a "-1" suffix: order by write time
    files = sorted((run_dir.root / "wandb").glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"),
                   key=lambda p: p.stat().st_mtime_ns)
    assert len(files) == 2  # the first process and the resumed one, one W&B run id
    logged: dict[str, dict[int, float]] = {}
    config: dict[str, object] = {}
    for path in files:  # in time order: the resumed file's values replace the dropped steps
        records = list(_wandb_records(path))
        assert records and records[-1].WhichOneof("record_type") == "exit", f"{path} was not closed"
        for record in records:
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json)
                         for i in record.history.item}
                for key, value in items.items():
                    if not key.startswith("_"):
                        logged.setdefault(key, {})[record.history.step.num] = float(value)
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    assert logged == _expected(run_dir)
    assert config["run"] == CONFIG["run"] and config["loss"] == CONFIG["loss"]


def test_trainer_refuses_a_missing_tracker_before_building(tmp_path, monkeypatch):
    import asyncio
    import importlib.util

    from spade.run.trainer import Trainer

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))

    async def build(self):
        raise AssertionError("the model was being built")

    monkeypatch.setattr(Trainer, "build", build)
    trainer = Trainer(from_dict({"run": {"loggers": ["tensorboard", "mlflow"]}}), tmp_path / "run")
    with pytest.raises(TrackerNotInstalled, match=r"run\.loggers: 'mlflow'"):
        asyncio.run(trainer.run())
