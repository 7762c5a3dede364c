"""What tau2 and ACEBench share: a benchmark whose own harness runs in a venv of its own.

Such a benchmark hands the harness a JSON config and starts a driver script (``drivers/<name>.py``)
with that venv's Python, by path, in a work directory (``DIR/<harness>`` to resume, else a
temporary one), without our ``PYTHONPATH``; the driver imports the harness and nothing of spade,
and writes its report to ``CONFIG["output"]``. The driver runs in a process group of its own
under a hard timeout: on the timeout, or when the evaluation is cancelled, the whole group is
killed; it dies with the evaluation too when that is terminated, exits or is killed
(``driver_lifetime``). What the run depended on is recorded per unit (a tau2 domain, an ACEBench
category) and a rerun under other settings is refused rather than mixed into the same files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Mapping, Optional, Sequence

from ..process_group import kill_group
from . import driver_lifetime
from .chat_interface import ChatModelLike
from .endpoint_options import UserSimulator
from .runner import EvalError, read_records, record_line
from .served_model import SERVED_NAME, serve_chat_model
from .types import BenchmarkScore, BenchmarkUnavailable, ItemRecord, SamplingSettings

DRIVERS = Path(__file__).resolve().parent / "drivers"
IMPORT_FAILED = 3  # a driver's exit status when its harness does not import (its output says why)
CONFIG_FILE = "driver_config.json"
OUTPUT_FILE = "driver_output.json"
DEFAULT_CONCURRENCY = 8


# ---------------------------------------------------------------------------- the venv


def venv_python(explicit: Optional[str], env_var: str, venv: str) -> Path:
    """The harness venv's interpreter: ``explicit``, ``$env_var``, the repository's ``venv``, or
    ``venv`` in the working directory (the first that exists)."""
    if explicit:
        return Path(explicit)
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    candidates = [Path(__file__).resolve().parents[2] / venv / "bin" / "python",
                  Path.cwd() / venv / "bin" / "python"]
    return next((c for c in candidates if c.exists()), candidates[0])


def probe(python: Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with ``python`` (checks that read metadata, not the harness itself);
    BenchmarkUnavailable when the interpreter cannot be run."""
    try:
        return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchmarkUnavailable(f"{python} cannot be run ({type(exc).__name__}: {exc})") from None


def driver_env() -> dict[str, str]:
    """This process's environment without what points Python at the trainer's venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


# ---------------------------------------------------------------------------- the work directory


@contextlib.contextmanager
def work_directory(out_dir: Optional[Path], harness: str) -> Iterator[Path]:
    """``DIR/<harness>`` (kept: the harness resumes from it), or a temporary directory."""
    with contextlib.ExitStack() as stack:
        work = Path(out_dir) / harness if out_dir is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix=f"spade-{harness}-")))
        work.mkdir(parents=True, exist_ok=True)
        yield work


def check_signature(path: Path, wanted: Mapping[str, Any], has_results: bool, refusal: str) -> None:
    """Record ``wanted`` (what a unit's results depend on) at ``path``; EvalError (``refusal``
    and the keys that differ) when results exist that were recorded under other settings."""
    if path.is_file() and has_results:
        before = json.loads(path.read_text())
        if before != wanted:
            changed = sorted(k for k in set(before) | set(wanted) if before.get(k) != wanted.get(k))
            raise EvalError(f"{refusal} ({', '.join(changed)} differ): use another --out or the same settings")
    path.write_text(json.dumps(wanted, indent=1))


# ---------------------------------------------------------------------------- the agent


@dataclass(frozen=True)
class AgentRequests:
    """How the harness asks the agent endpoint: the model name, the chat-template keywords (the
    served model's own; none for an outside endpoint), the fields OpenAI's API lacks (sent as
    ``extra_body``) and how many dialogues run at once."""

    model: str
    template_kwargs: dict[str, Any]
    extra_body: dict[str, Any]
    concurrency: int


def agent_requests(settings: Any, sampling: SamplingSettings, model: ChatModelLike) -> AgentRequests:
    """From a harness's settings (``agent_url``, ``agent_model``, ``max_concurrency``)."""
    own = settings.agent_url is None
    template = dict(model.template_kwargs or {}) if own else {}
    extra: dict[str, Any] = {}
    if sampling.top_k:
        extra["top_k"] = sampling.top_k
    if template:
        extra["chat_template_kwargs"] = template
    concurrency = settings.max_concurrency or model.concurrency or DEFAULT_CONCURRENCY
    return AgentRequests(settings.agent_model or SERVED_NAME, template, extra, concurrency)


@contextlib.asynccontextmanager
async def agent_endpoint(settings: Any, model: ChatModelLike) -> AsyncIterator[str]:
    """The base URL of the agent: ``settings.agent_url``, or the model served here meanwhile."""
    if settings.agent_url:
        yield settings.agent_url
    else:
        async with serve_chat_model(model) as url:
            yield url


# ---------------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class Driver:
    """One run of ``script`` (``DRIVERS / <name>.py``) with ``python`` in ``work``. ``label`` names
    the harness in errors (``tau2``, ``ACEBench``), ``timeout_key`` the setting of ``timeout_s``
    (None: no limit), ``stdin`` is what the driver reads (None: nothing), ``error`` the exception a
    failure raises."""

    label: str
    script: Path
    python: Path
    work: Path
    log: Path
    env: Mapping[str, str]
    timeout_key: str
    timeout_s: Optional[float]
    error: type[RuntimeError]
    stdin: Optional[bytes] = None


async def run_driver(driver: Driver, config: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``config`` (with ``output`` set), run the driver, return its report (``import_error``
    in it when the harness did not import). Kills the driver's process group on the timeout (and
    raises ``driver.error``) or when cancelled; ``driver.error`` with the log's tail when the
    driver failed."""
    config_path = driver.work / CONFIG_FILE
    output = driver.work / OUTPUT_FILE
    config_path.write_text(json.dumps({**config, "output": str(output)}, indent=1))
    output.unlink(missing_ok=True)
    with open(driver.log, "ab") as log:
        process = await asyncio.create_subprocess_exec(
            str(driver.python), str(driver.script), str(config_path),
            stdin=asyncio.subprocess.DEVNULL if driver.stdin is None else asyncio.subprocess.PIPE,
            stdout=log, stderr=subprocess.STDOUT, cwd=driver.work, env=dict(driver.env), start_new_session=True,
            preexec_fn=driver_lifetime.die_with_parent_hook())
        driver_lifetime.track(process.pid)
        try:
            if driver.stdin is not None:
                assert process.stdin is not None
                process.stdin.write(driver.stdin)
                await process.stdin.drain()
                process.stdin.close()
            code = await asyncio.wait_for(process.wait(), driver.timeout_s)
        except asyncio.TimeoutError:
            kill_group(process.pid)
            await process.wait()
            raise driver.error(f"{driver.label} did not finish within {driver.timeout_key}={driver.timeout_s} s "
                               f"(log: {driver.log})") from None
        except BaseException:
            kill_group(process.pid)
            await process.wait()
            raise
        finally:
            driver_lifetime.untrack(process.pid)
    report = json.loads(output.read_text()) if output.is_file() else None
    if report is None or code not in (0, IMPORT_FAILED):
        tail = driver.log.read_text(errors="replace")[-3000:]
        raise driver.error(f"the {driver.label} driver exited with {code} (log: {driver.log}):\n{tail}")
    return report


# ---------------------------------------------------------------------------- results


def write_records(path: Path, records: Mapping[str, Sequence[ItemRecord]]) -> None:
    """Rewrite ``path`` with these units' records, keeping the lines of other units."""
    kept = [r for r in read_records(path).values() if r.group not in records]
    lines = [record_line(r) for r in kept + [r for rs in records.values() for r in rs]]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def unit_score(name: str, metric: str, groups: Mapping[str, float], records: Mapping[str, Sequence[ItemRecord]],
               notes: Mapping[str, str], user: UserSimulator) -> BenchmarkScore:
    """The benchmark's score: the mean of the units' scores, labelled off-protocol when the user
    simulator is the model under test."""
    score = sum(groups.values()) / len(groups) if groups else None
    return BenchmarkScore(name, score, sum(len(r) for r in records.values()),
                          sum(len(x.samples) for r in records.values() for x in r), dict(groups),
                          metric=metric, notes=dict(notes), off_protocol=user.off_protocol)
