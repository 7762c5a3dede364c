"""ACEBench-Agent (multi-step and multi-turn) run by ACEBench's own code, from a local checkout.

ACEBench ships no package: its data (``data_all/data_<lang>/data_agent_*.json`` and
``possible_answer/``), its simulated apps (the scenario classes under ``model_inference``), its
agent/user/execution roles and its scorer (``eval_main.agent_eval``) live only in its repository
(MIT). The user points ``acebench.repo`` (or ``$SPADE_ACEBENCH_DIR``) at a checkout; nothing of it
is copied into spade. Its Python dependencies (pandas, openpyxl, wcwidth, openai) are not the
trainer's, so it runs in ``.venv-acebench`` (``make acebench``, pinned by
``requirements/acebench.txt``) as a subprocess of that venv's Python. A run:

1. The agent endpoint: the evaluated model served over HTTP in this process by ``spade serve``'s
   application (as for tau2), or an already running endpoint (``agent_url``). The user simulator
   of the multi-turn category talks to ``user_url`` (any OpenAI-compatible endpoint; the paper's is
   an external model, gpt-4o in the released config) or, by default, to the agent's endpoint: a
   self-simulated run, labelled so (``off_protocol``) and kept out of the paper's column.
2. The driver (``drivers/acebench_driver.py``, run in the ACEBench venv by ``external_harness``)
   imports ACEBench from the checkout and, per item, calls its
   ``CommonInference.multi_step_inference`` / ``multi_turn_inference`` (ACEBench's dialogue loop
   for locally served models: its prompts, its ``Scene``, its ``EXECUTION`` roles running the
   scenario classes, its ``APIUSER`` user simulator), with two seams replaced: the local model
   object (``inference(system_prompt, user_prompt)``, in ACEBench a vLLM engine) becomes a client
   of the agent endpoint at our sampling settings, and ``APIUSER``'s endpoint (which ACEBench picks
   from a substring of the model name) becomes the configured user endpoint. Results are written
   by ACEBench's ``write_result`` and sorted by its ``sort_json``, then scored by ACEBench's
   ``agent_eval`` (end-to-end accuracy: the final state of the apps against ``possible_answer``)
   and ``agent_eval_process`` (process accuracy: the ground-truth milestones found in order among
   the executed calls), once per item and once per category.
3. ``DIR/acebench/`` is ACEBench's working directory (``result_all/``, ``score_all/`` and the
   dialogue transcripts under ``data_all/data_<lang>/dialogue_history/``; the data files there are
   links into the checkout, which is never written). ``DIR/acebench_agent.jsonl`` gets one line
   per item (its trials as samples, end-to-end correctness as score); group scores are the
   end-to-end accuracy per category in percent (mean over trials), the benchmark score their mean
   (Table 2's ACEBench-Agent column, ACEBench's own ``agent_summary``).

ACEBench's execution role evaluates the agent's call text with Python's ``eval`` (as its own
harness does; arithmetic inside arguments is evaluated too), in the driver's process: run it on
models you would run ACEBench itself on.

Resume: items already in ACEBench's result file are not run again (as ACEBench's ``generate.py``
does); an item whose run failed or whose line was cut by a kill is run again.
``DIR/acebench/<category>.settings.json`` records what a category was run with; a rerun under
other settings is refused rather than mixed in.
"""

from __future__ import annotations

import json
import os
import subprocess
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

REPO_ENV = "SPADE_ACEBENCH_DIR"
PYTHON_ENV = "SPADE_ACEBENCH_PYTHON"
INSTALL_HINT = "run 'make acebench' (builds .venv-acebench from requirements/acebench.txt)"
CHECKOUT_HINT = (f"set ${REPO_ENV} or --acebench repo=PATH to a checkout of the ACEBench repository "
                 "(ACEBench/ACEBench on GitHub, MIT)")
CATEGORIES = ("multi_step", "multi_turn")
LANGUAGES = ("en", "zh")
# The paper's ACEBench config: en, all tests, T 0.7, top_p 1.0, 16,384 tokens, 40 dialogue turns.
ACEBENCH_SAMPLING = SamplingSettings(n=1, temperature=0.7, top_p=1.0, top_k=None, max_new_tokens=16384)
# What the driver imports, checked without importing ACEBench (metadata only).
REQUIRED_MODULES = ("openai", "wcwidth", "pandas", "openpyxl", "tqdm", "dotenv")


class AceBenchError(RuntimeError):
    """ACEBench ran but failed (an item raised with ``skip_failed`` off, or ``timeout_s`` passed)."""


@dataclass(frozen=True)
class AceBenchSettings:
    """The ``acebench`` settings (``spade eval --acebench KEY=VALUE``). Trials are the sampling's ``n``.

    ``repo``: the ACEBench checkout (default ``$SPADE_ACEBENCH_DIR``). ``categories``: the agent
    categories to run. ``language``: ACEBench's data language. ``max_dialog_turns``: ACEBench's
    message limit per dialogue (its ``--max-dialog-turns``). ``agent_url``/``agent_model``: evaluate
    the model served there instead of the loaded one. ``user_url``/``user_model``: the user
    simulator (default: the agent's endpoint and model); ``user_api_key_env`` names the
    environment variable holding its key; ``user_temperature``/``user_top_p``/``user_max_tokens``
    default to ACEBench's own ``APIUSER`` values. ``skip_failed``: an item whose run raises (an
    endpoint error) scores 0 and is counted in the notes, instead of stopping the run.
    ``python``: the venv's interpreter (default ``$SPADE_ACEBENCH_PYTHON``, else ``.venv-acebench``).
    """

    repo: Optional[str] = None
    categories: tuple[str, ...] = CATEGORIES
    language: str = "en"
    max_dialog_turns: int = 40
    agent_url: Optional[str] = None
    agent_model: Optional[str] = None
    user_url: Optional[str] = None
    user_model: Optional[str] = None
    user_api_key_env: Optional[str] = None
    user_temperature: float = 0.001
    user_top_p: float = 1.0
    user_max_tokens: int = 1000
    max_concurrency: Optional[int] = None
    skip_failed: bool = True
    python: Optional[str] = None
    timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "categories", tuple(self.categories))
        if not self.categories:
            raise ValueError(f"acebench.categories is empty; allowed: {', '.join(CATEGORIES)}")
        unknown = [c for c in self.categories if c not in CATEGORIES]
        if unknown:
            raise ValueError(f"acebench.categories: unknown {', '.join(unknown)}; allowed: {', '.join(CATEGORIES)}")
        if self.language not in LANGUAGES:
            raise ValueError(f"acebench.language must be one of {', '.join(LANGUAGES)}, got {self.language!r}")
        if not 0 < self.user_top_p <= 1:
            raise ValueError(f"acebench.user_top_p must be in (0, 1], got {self.user_top_p}")
        check_harness_settings(self, "acebench", ("max_dialog_turns", "user_max_tokens"))

    @classmethod
    def from_pairs(cls, pairs: Sequence[str]) -> "AceBenchSettings":
        """Settings from ``KEY=VALUE`` strings (lists comma-separated; ``none`` for no value)."""
        return settings_from_pairs(cls, pairs, "acebench")


# ---------------------------------------------------------------------------- checkout and venv


def checkout(settings: AceBenchSettings) -> Path:
    """The ACEBench checkout; BenchmarkUnavailable (with the reason) when none is given or it lacks
    the agent data of the language or the code the driver imports."""
    text = settings.repo or os.environ.get(REPO_ENV)
    if not text:
        raise BenchmarkUnavailable(f"no ACEBench checkout: {CHECKOUT_HINT}")
    root = Path(text).expanduser()
    needed = [f"data_all/data_{settings.language}/data_agent_{c}.json" for c in settings.categories]
    needed += [f"data_all/data_{settings.language}/possible_answer/data_agent_{c}.json" for c in settings.categories]
    needed += ["eval_main.py", "generate.py", "model_inference/common_inference.py", "model_eval/checker.py"]
    missing = [n for n in needed if not (root / n).is_file()]
    if missing:
        raise BenchmarkUnavailable(f"{root} is not an ACEBench checkout (missing {', '.join(missing[:3])}"
                                   f"{', ...' if len(missing) > 3 else ''}): {CHECKOUT_HINT}")
    return root


def checkout_commit(root: Path) -> Optional[str]:
    """The checkout's commit when it is a git work tree (recorded with the results)."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def acebench_python(explicit: Optional[str] = None) -> Path:
    """The venv's interpreter: ``explicit``, ``$SPADE_ACEBENCH_PYTHON``, the repository's
    ``.venv-acebench``, or ``.venv-acebench`` in the working directory (the first that exists)."""
    return venv_python(explicit, PYTHON_ENV, ".venv-acebench")


def check_python(python: Path) -> None:
    """BenchmarkUnavailable (with the reason) when the venv or a module the driver needs is missing."""
    if not python.exists():
        raise BenchmarkUnavailable(f"no ACEBench venv: {python} does not exist ({INSTALL_HINT}, or point "
                                   f"acebench.python / ${PYTHON_ENV} at a Python with requirements/acebench.txt)")
    done = probe(python, "import importlib.util as u\n"
                         f"missing = [m for m in {REQUIRED_MODULES!r} if u.find_spec(m) is None]\n"
                         "print(','.join(missing))")
    if done.returncode != 0 or done.stdout.strip():
        what = done.stdout.strip() or (done.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchmarkUnavailable(f"{python} lacks what ACEBench needs ({what}); {INSTALL_HINT}")


# ---------------------------------------------------------------------------- the benchmark


class AceBenchAgent(Benchmark):
    """ACEBench-Agent by ACEBench's own code: end-to-end accuracy per category, their mean."""

    name = "acebench_agent"
    metric = "accuracy"

    def __init__(self, settings: Optional[AceBenchSettings] = None, *,
                 sampling: SamplingSettings = ACEBENCH_SAMPLING):
        self.settings = settings or AceBenchSettings()
        self.sampling = sampling

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        """One item per category (ACEBench enumerates its items itself); raises BenchmarkUnavailable
        without a checkout or the venv."""
        checkout(self.settings)
        check_python(acebench_python(self.settings.python))
        return [EvalItem(c, (), group=c) for c in self.settings.categories]

    async def play(self, item: EvalItem, model: ChatModelLike, seed: int) -> SampleRecord:
        raise NotImplementedError("ACEBench runs whole categories in its own process: use AceBenchAgent.run")

    async def run(self, model: ChatModelLike, *, seed: int = 0, limit: Optional[int] = None,
                  out_dir: Optional[Path] = None, progress: Optional[Progress] = None) -> BenchmarkScore:
        """Run the categories through ACEBench (resuming ``DIR/acebench``), write the records, score."""
        try:
            root = checkout(self.settings)
            python = acebench_python(self.settings.python)
            check_python(python)
        except BenchmarkUnavailable as exc:
            return BenchmarkScore(self.name, None, skipped=str(exc), metric=self.metric)
        commit = checkout_commit(root)
        with work_directory(out_dir, "acebench") as work:
            self._check_settings(work, seed, limit, commit)
            link_data(root, work, self.settings)
            if progress:
                progress(self.name, 0, len(self.settings.categories))
            async with agent_endpoint(self.settings, model) as agent_url:
                report = await run_driver(self._driver(python, work),
                                          self._driver_config(model, agent_url, root, seed, limit))
            if "import_error" in report:
                why = f"ACEBench ({root}) does not import in {python}: {report['import_error']}"
                return BenchmarkScore(self.name, None, metric=self.metric, skipped=why)
            for trial, categories in report["trials"].items():
                for category, result in categories.items():
                    if "error" in result:
                        raise AceBenchError(f"ACEBench failed on {category} (trial {trial}; log: "
                                            f"{work / 'acebench.log'}):\n{result['error']}")
            records = category_records(report, seed, model.engine.weight_version)
            if out_dir is not None:
                write_records(Path(out_dir) / f"{self.name}.jsonl", records)
            if progress:
                progress(self.name, len(records), len(self.settings.categories))
            return category_score(self.name, report, records, root, commit,
                                  user_simulator(self.settings, "acebench"))

    def _signature(self, seed: int, limit: Optional[int], commit: Optional[str]) -> dict[str, Any]:
        """What a category's results depend on besides the model (ports and paths left out)."""
        s = self.settings
        return {"checkout_commit": commit, "language": s.language, "limit": limit, "trials": self.sampling.n,
                "max_dialog_turns": s.max_dialog_turns, "seed": seed,
                "agent": {"url": s.agent_url, "model": s.agent_model, "sampling": asdict(self.sampling)},
                "user": {"url": s.user_url, "model": s.user_model, "temperature": s.user_temperature,
                         "top_p": s.user_top_p, "max_tokens": s.user_max_tokens}}

    def _check_settings(self, work: Path, seed: int, limit: Optional[int], commit: Optional[str]) -> None:
        wanted = self._signature(seed, limit, commit)
        for category in self.settings.categories:
            check_signature(work / f"{category}.settings.json", wanted, (work / "result_all").is_dir(),
                            f"{work} holds ACEBench {category} results run with other settings")

    def _driver_config(self, model: ChatModelLike, agent_url: str, root: Path, seed: int,
                       limit: Optional[int]) -> dict[str, Any]:
        s, sampling = self.settings, self.sampling
        agent = agent_requests(s, sampling, model)
        user: dict[str, Any] = {"url": s.user_url or agent_url, "model": s.user_model or agent.model,
                                "api_key": "spade" if s.user_url is None else "none",
                                "api_key_env": s.user_api_key_env, "temperature": s.user_temperature,
                                "top_p": s.user_top_p, "max_tokens": s.user_max_tokens, "max_retries": 2}
        return {"repo": str(root.resolve()), "language": s.language, "categories": list(s.categories),
                "limit": limit, "trials": sampling.n, "max_dialog_turns": s.max_dialog_turns, "seed": seed,
                "max_concurrency": agent.concurrency, "skip_failed": s.skip_failed,
                "agent": {"url": agent_url, "model": agent.model, "api_key": "spade", "max_retries": 2,
                          "temperature": sampling.temperature, "top_p": sampling.top_p,
                          "max_tokens": sampling.max_new_tokens, "extra_body": agent.extra_body},
                "user": user}

    def _driver(self, python: Path, work: Path) -> Driver:
        if self.settings.user_api_key_env and not os.environ.get(self.settings.user_api_key_env):
            raise ValueError(f"acebench.user_api_key_env: ${self.settings.user_api_key_env} is not set")
        return Driver("ACEBench", DRIVERS / "acebench_driver.py", python, work, work / "acebench.log", driver_env(),
                      "acebench.timeout_s", self.settings.timeout_s, AceBenchError)


def link_data(root: Path, work: Path, settings: AceBenchSettings) -> None:
    """``work/data_all/data_<lang>/`` with links to the checkout's agent data and answers: ACEBench
    reads its data and writes its dialogue transcripts under ``./data_all``, so the transcripts land
    in ``work`` and the checkout is left as it was."""
    source = root.resolve() / "data_all" / f"data_{settings.language}"
    target = work / "data_all" / f"data_{settings.language}"
    (target / "possible_answer").mkdir(parents=True, exist_ok=True)
    for category in settings.categories:
        for rel in (f"data_agent_{category}.json", f"possible_answer/data_agent_{category}.json"):
            link = target / rel
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(source / rel)


# ---------------------------------------------------------------------------- results


def category_records(report: Mapping[str, Any], seed: int, weight_version: int = 0) -> dict[str, list[ItemRecord]]:
    """One record per ACEBench item and category, in ACEBench's order, its trials as samples."""
    trials = sorted(report["trials"], key=int)
    records: dict[str, list[ItemRecord]] = {}
    for category in (report["trials"][trials[0]] if trials else {}):
        by_trial = [report["trials"][t][category]["items"] for t in trials]
        rows = []
        for position, first in enumerate(by_trial[0]):
            samples = []
            for trial, items in zip(trials, by_trial):
                item = items[position]
                verdict = "correct" if item["correct"] else ("run failed" if item.get("run_error")
                                                            else item.get("error_type") or "wrong")
                detail = {"trial": int(trial), "process_accuracy": item["process_accuracy"],
                          "error_type": item.get("error_type"), "errors": item.get("errors"),
                          "run_error": item.get("run_error"), "finish_reasons": item.get("finish_reasons")}
                samples.append(SampleRecord(json.dumps(item["calls"], ensure_ascii=False), verdict,
                                            1.0 if item["correct"] else 0.0, bool(item["correct"]),
                                            "error" if item.get("run_error") else "stop", 0, detail))
            rows.append(ItemRecord(f"{category}/{first['id']}", category, tuple(samples), seed, weight_version))
        records[category] = rows
    return records


def category_score(name: str, report: Mapping[str, Any], records: Mapping[str, Sequence[ItemRecord]],
                   root: Path, commit: Optional[str], user: UserSimulator) -> BenchmarkScore:
    """Per category: ACEBench's end-to-end accuracy in percent (mean over trials); the score is the
    mean over categories (ACEBench's agent_summary). Process accuracy and failed runs in the notes;
    labelled off-protocol when ``user`` is the model under test."""
    trials = list(report["trials"].values())
    groups: dict[str, float] = {}
    notes = {"acebench": f"{root}" + (f" at {commit}" if commit else ""), "user_simulator": user.note}
    for category in records:
        results = [t[category] for t in trials]
        groups[category] = 100.0 * sum(r["accuracy"] for r in results) / len(results)
        process = 100.0 * sum(r["process_accuracy"] for r in results) / len(results)
        failed = sum(1 for r in results for i in r["items"] if i.get("run_error"))
        notes[category] = (f"process accuracy {process:.1f}; {failed} runs failed (scored 0); "
                           f"ACEBench results: {results[-1]['result_file']}; scores: {results[-1]['score_file']}")
    return unit_score(name, "accuracy", groups, records, notes, user)
