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
2. A driver script (``DRIVER``) imports ACEBench from the checkout and, per item, calls its
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

REPO_ENV = "SPADE_ACEBENCH_DIR"
PYTHON_ENV = "SPADE_ACEBENCH_PYTHON"
INSTALL_HINT = "run 'make acebench' (builds .venv-acebench from requirements/acebench.txt)"
CHECKOUT_HINT = (f"set ${REPO_ENV} or --acebench repo=PATH to a checkout of the ACEBench repository "
                 "(ACEBench/ACEBench on GitHub, MIT)")
CATEGORIES = ("multi_step", "multi_turn")
LANGUAGES = ("en", "zh")
SERVED_NAME = "spade-agent"
# The paper's ACEBench config: en, all tests, T 0.7, top_p 1.0, 16,384 tokens, 40 dialogue turns.
ACEBENCH_SAMPLING = SamplingSettings(n=1, temperature=0.7, top_p=1.0, top_k=None, max_new_tokens=16384)
# What the driver imports, checked without importing ACEBench (metadata only).
REQUIRED_MODULES = ("openai", "wcwidth", "pandas", "openpyxl", "tqdm", "dotenv")
IMPORT_FAILED = 3  # the driver's exit status when ACEBench does not import


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
        for key in ("max_dialog_turns", "user_max_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"acebench.{key} must be >= 1, got {getattr(self, key)}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"acebench.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.user_temperature < 0:
            raise ValueError(f"acebench.user_temperature must be >= 0, got {self.user_temperature}")
        if not 0 < self.user_top_p <= 1:
            raise ValueError(f"acebench.user_top_p must be in (0, 1], got {self.user_top_p}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"acebench.timeout_s must be > 0, got {self.timeout_s}")
        check_endpoints(self, "acebench")

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
    if explicit:
        return Path(explicit)
    if os.environ.get(PYTHON_ENV):
        return Path(os.environ[PYTHON_ENV])
    candidates = [Path(__file__).resolve().parents[2] / ".venv-acebench" / "bin" / "python",
                  Path.cwd() / ".venv-acebench" / "bin" / "python"]
    return next((c for c in candidates if c.exists()), candidates[0])


def check_python(python: Path) -> None:
    """BenchmarkUnavailable (with the reason) when the venv or a module the driver needs is missing."""
    if not python.exists():
        raise BenchmarkUnavailable(f"no ACEBench venv: {python} does not exist ({INSTALL_HINT}, or point "
                                   f"acebench.python / ${PYTHON_ENV} at a Python with requirements/acebench.txt)")
    probe = ("import importlib.util as u\n"
             f"missing = [m for m in {REQUIRED_MODULES!r} if u.find_spec(m) is None]\n"
             "print(','.join(missing))")
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchmarkUnavailable(f"{python} cannot be run ({type(exc).__name__}: {exc})") from None
    if done.returncode != 0 or done.stdout.strip():
        what = done.stdout.strip() or (done.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchmarkUnavailable(f"{python} lacks what ACEBench needs ({what}); {INSTALL_HINT}")


# ---------------------------------------------------------------------------- the driver

# Runs in the ACEBench venv, in the work directory: ``python -c DRIVER CONFIG.json``.
DRIVER = r'''
import hashlib, importlib.util, json, os, sys, threading, traceback, types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

cfg = json.loads(Path(sys.argv[1]).read_text())
out_path = Path(cfg["output"])
sys.path.insert(0, cfg["repo"])


def placeholder(name, attrs):
    # ACEBench's model_infer imports vLLM and google-generativeai at module level for its local and
    # Gemini backends; the evaluated model is reached over HTTP here, so they are never called.
    module = types.ModuleType(name)
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{name} is not installed: the ACEBench driver talks to models over HTTP")
    for attr in attrs:
        setattr(module, attr, unavailable)
    return module


if importlib.util.find_spec("vllm") is None:
    sys.modules["vllm"] = placeholder("vllm", ("LLM", "SamplingParams"))
try:
    import google.generativeai  # noqa: F401
except ImportError:
    google = sys.modules.get("google") or sys.modules.setdefault("google", types.ModuleType("google"))
    google.generativeai = sys.modules["google.generativeai"] = placeholder("google.generativeai",
                                                                           ("configure", "GenerativeModel"))
try:
    from openai import OpenAI
    import eval_main
    from generate import sort_json
    from model_eval.evaluation_helper import load_file
    from model_inference import common_inference
    from model_inference.base_inference import BaseHandler
    from model_inference.common_inference import CommonInference
    from model_inference.multi_turn.APIModel_user import APIUSER
except Exception as exc:
    out_path.write_text(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(3)

lang = cfg["language"]
agent, user = cfg["agent"], cfg["user"]


class EndpointModel:
    """The evaluated model in the place of ACEBench's local model object: the same
    inference(system_prompt, user_prompt) -> text, answered by the agent endpoint."""

    def __init__(self, seed):
        self.client = OpenAI(base_url=agent["url"], api_key=agent["api_key"], max_retries=agent["max_retries"])
        self.seed, self.calls, self.finish = seed, 0, []

    def inference(self, system_prompt, user_prompt):
        request = {"model": agent["model"], "temperature": agent["temperature"], "top_p": agent["top_p"],
                   "max_tokens": agent["max_tokens"], "seed": (self.seed + self.calls) % (1 << 31),
                   "messages": [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_prompt}]}
        if agent["extra_body"]:
            request["extra_body"] = agent["extra_body"]
        self.calls += 1
        response = self.client.chat.completions.create(**request)
        self.finish.append(response.choices[0].finish_reason)
        return response.choices[0].message.content or ""


class EndpointUser(APIUSER):
    """ACEBench's user simulator (its prompts, step and respond) with its client on the configured
    endpoint: ACEBench picks an endpoint from a substring of the model name (gpt, qwen, ...)."""

    def __init__(self, model_name, involved_class, temperature=0.001, top_p=1, max_tokens=1000, language="zh"):
        key = os.environ.get(user["api_key_env"]) if user["api_key_env"] else user["api_key"]
        self.client = OpenAI(base_url=user["url"], api_key=key or "none", max_retries=user["max_retries"])
        self.model_name = user["model"]
        self.temperature, self.top_p, self.max_tokens = user["temperature"], user["top_p"], user["max_tokens"]
        self.involved_class, self.messages, self.language = involved_class, [], language


common_inference.APIUSER = EndpointUser


def new_inference(run_name, seed):
    # CommonInference's __init__ loads a tokenizer and a vLLM engine; its agent loops need only these.
    inference = CommonInference.__new__(CommonInference)
    BaseHandler.__init__(inference, run_name, None, agent["temperature"], agent["top_p"], agent["max_tokens"], lang)
    inference.model_path, inference.user_model = None, user["model"]
    inference.max_message_index = cfg["max_dialog_turns"]
    inference.model = EndpointModel(seed)
    return inference


def item_seed(trial, item_id):
    digest = hashlib.sha256(f"{cfg['seed']}:{trial}:{item_id}".encode()).hexdigest()
    return int(digest[:8], 16)


def kept_lines(path):
    """Finished items of an earlier run: parsable lines without a run error, first per id."""
    if not path.is_file():
        return []
    kept, seen = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "run_error" not in entry and entry.get("id") not in seen:
            seen.add(entry["id"])
            kept.append(line)
    return kept


def run_category(trial, category):
    name = f"agent_{category}"
    run_name = f"spade_trial{trial}"
    data_dir = f"./data_all/data_{lang}/"
    result_dir = f"./result_all/result_{lang}/"
    cases = load_file(f"{data_dir}data_{name}.json")[: cfg["limit"]]
    answers = load_file(f"{data_dir}possible_answer/data_{name}.json")[: cfg["limit"]]
    if [c["id"] for c in cases] != [a["id"] for a in answers]:
        raise RuntimeError(f"data_{name}.json and its possible_answer list different ids")
    result_file = Path(f"{result_dir}{run_name}/data_{name}_result.json")
    result_file.parent.mkdir(parents=True, exist_ok=True)
    kept = kept_lines(result_file)
    result_file.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    done = {json.loads(line)["id"] for line in kept}
    lock, failures, finish = threading.Lock(), {}, {}

    def one(case):
        inference = new_inference(run_name, item_seed(trial, case["id"]))
        functions = case["function"]
        if isinstance(functions, (dict, str)):
            functions = [functions]
        try:
            result, process = inference.inference(case["question"], functions, "", "", case, case["id"])
            entry = {"id": case["id"], "result": result, "process": process}
            json.dumps(entry)
        except Exception:
            if not cfg["skip_failed"]:
                raise
            text = traceback.format_exc()[-2000:]
            entry = {"id": case["id"], "result": [], "process": [], "run_error": text}
            failures[case["id"]] = text
        finish[case["id"]] = inference.model.finish
        with lock:
            inference.write_result(entry, run_name, result_dir)

    todo = [c for c in cases if c["id"] not in done]
    with ThreadPoolExecutor(max_workers=cfg["max_concurrency"]) as pool:
        for future in [pool.submit(one, c) for c in todo]:
            future.result()
    sort_json(str(result_file))
    results = load_file(str(result_file))
    if [r["id"] for r in results] != [c["id"] for c in cases]:
        raise RuntimeError(f"{result_file} does not hold exactly the {len(cases)} items run")

    eval_main.language = lang  # agent_eval reads these module globals, set by eval_main's __main__
    eval_main.OUTPUT_PATH = f"./score_all/score_{lang}/"
    os.makedirs(f"{eval_main.OUTPUT_PATH}{run_name}", exist_ok=True)
    items = []
    for index, (result, case, answer) in enumerate(zip(results, cases, answers)):
        correct, process = eval_main.agent_eval([result], [case], [answer], name, run_name)
        items.append({"id": case["id"], "correct": correct == 1, "process_accuracy": process,
                      "calls": result["process"], "run_error": result.get("run_error"),
                      "finish_reasons": finish.get(case["id"])})
    # Last, over the whole category, so that ACEBench's score files are those of the full run.
    accuracy, process_accuracy = eval_main.agent_eval(results, cases, answers, name, run_name)
    score_file = Path(f"{eval_main.OUTPUT_PATH}{run_name}/data_{name}_score.json")
    for row in load_file(str(score_file))[1:]:
        items[row["id"]]["error_type"] = row.get("error_type")
        items[row["id"]]["errors"] = [str(e)[:500] for e in row.get("error", [])][:5]
    return {"accuracy": accuracy, "process_accuracy": process_accuracy, "items": items,
            "result_file": str(result_file.resolve()), "score_file": str(score_file.resolve())}


report = {"trials": {}}
for trial in range(cfg["trials"]):
    report["trials"][str(trial)] = {}
    for category in cfg["categories"]:
        try:
            report["trials"][str(trial)][category] = run_category(trial, category)
        except BaseException:
            report["trials"][str(trial)][category] = {"error": traceback.format_exc()[-4000:]}
        out_path.write_text(json.dumps(report))
'''


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

    async def play(self, item: EvalItem, model: Any, seed: int) -> SampleRecord:
        raise NotImplementedError("ACEBench runs whole categories in its own process: use AceBenchAgent.run")

    async def run(self, model: Any, *, seed: int = 0, limit: Optional[int] = None, out_dir: Optional[Path] = None,
                  progress: Any = None) -> BenchmarkScore:
        """Run the categories through ACEBench (resuming ``DIR/acebench``), write the records, score."""
        try:
            root = checkout(self.settings)
            python = acebench_python(self.settings.python)
            check_python(python)
        except BenchmarkUnavailable as exc:
            return BenchmarkScore(self.name, None, skipped=str(exc), metric=self.metric)
        commit = checkout_commit(root)
        with contextlib.ExitStack() as stack:
            work = Path(out_dir) / "acebench" if out_dir is not None else Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="spade-acebench-")))
            work.mkdir(parents=True, exist_ok=True)
            self._check_settings(work, seed, limit, commit)
            link_data(root, work, self.settings)
            if progress:
                progress(self.name, 0, len(self.settings.categories))
            async with self._agent_endpoint(model) as agent_url:
                report = await self._run_driver(python, work, self._driver_config(model, agent_url, root, work,
                                                                                    seed, limit))
            if "import_error" in report:
                return BenchmarkScore(self.name, None, metric=self.metric,
                                      skipped=f"ACEBench ({root}) does not import in {python}: {report['import_error']}")
            for trial, categories in report["trials"].items():
                for category, result in categories.items():
                    if "error" in result:
                        raise AceBenchError(f"ACEBench failed on {category} (trial {trial}; log: "
                                            f"{work / 'acebench.log'}):\n{result['error']}")
            records = category_records(report, seed, getattr(model.engine, "weight_version", 0))
            if out_dir is not None:
                from .tau2_bench import write_records

                write_records(Path(out_dir) / f"{self.name}.jsonl", records)
            if progress:
                progress(self.name, len(records), len(self.settings.categories))
            from .tau2_bench import user_simulator

            return category_score(self.name, report, records, root, commit,
                                  user_simulator(self.settings, "acebench"))

    @contextlib.asynccontextmanager
    async def _agent_endpoint(self, model: Any) -> AsyncIterator[str]:
        if self.settings.agent_url:
            yield self.settings.agent_url
        else:
            from .tau2_bench import serve_chat_model

            async with serve_chat_model(model) as url:
                yield url

    def _signature(self, seed: int, limit: Optional[int], commit: Optional[str]) -> dict[str, Any]:
        """What a category's results depend on besides the model (ports and paths left out)."""
        s = self.settings
        return {"checkout_commit": commit, "language": s.language, "limit": limit, "trials": self.sampling.n,
                "max_dialog_turns": s.max_dialog_turns, "seed": seed,
                "agent": {"url": s.agent_url, "model": s.agent_model, "sampling": asdict(self.sampling)},
                "user": {"url": s.user_url, "model": s.user_model, "temperature": s.user_temperature,
                         "top_p": s.user_top_p, "max_tokens": s.user_max_tokens}}

    def _check_settings(self, work: Path, seed: int, limit: Optional[int], commit: Optional[str]) -> None:
        from .runner import EvalError

        wanted = self._signature(seed, limit, commit)
        for category in self.settings.categories:
            path = work / f"{category}.settings.json"
            if path.is_file() and (work / "result_all").is_dir():
                before = json.loads(path.read_text())
                if before != wanted:
                    changed = sorted(k for k in set(before) | set(wanted) if before.get(k) != wanted.get(k))
                    raise EvalError(f"{work} holds ACEBench {category} results run with other settings "
                                    f"({', '.join(changed)} differ): use another --out or the same settings")
            path.write_text(json.dumps(wanted, indent=1))

    def _driver_config(self, model: Any, agent_url: str, root: Path, work: Path, seed: int,
                       limit: Optional[int]) -> dict[str, Any]:
        s, sampling = self.settings, self.sampling
        own = s.agent_url is None
        agent_model = s.agent_model or SERVED_NAME
        template = dict(getattr(model, "template_kwargs", None) or {}) if own else {}
        extra: dict[str, Any] = {}
        if sampling.top_k:
            extra["top_k"] = sampling.top_k
        if template:
            extra["chat_template_kwargs"] = template
        user: dict[str, Any] = {"url": s.user_url or agent_url, "model": s.user_model or agent_model,
                                "api_key": "spade" if s.user_url is None else "none",
                                "api_key_env": s.user_api_key_env, "temperature": s.user_temperature,
                                "top_p": s.user_top_p, "max_tokens": s.user_max_tokens, "max_retries": 2}
        concurrency = s.max_concurrency or getattr(model, "concurrency", None) or 8
        return {"repo": str(root.resolve()), "language": s.language, "categories": list(s.categories),
                "limit": limit, "trials": sampling.n, "max_dialog_turns": s.max_dialog_turns, "seed": seed,
                "max_concurrency": concurrency, "skip_failed": s.skip_failed,
                "output": str(work / "driver_output.json"),
                "agent": {"url": agent_url, "model": agent_model, "api_key": "spade", "max_retries": 2,
                          "temperature": sampling.temperature, "top_p": sampling.top_p,
                          "max_tokens": sampling.max_new_tokens, "extra_body": extra},
                "user": user}

    def _driver_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        if self.settings.user_api_key_env and not os.environ.get(self.settings.user_api_key_env):
            raise ValueError(f"acebench.user_api_key_env: ${self.settings.user_api_key_env} is not set")
        return env

    async def _run_driver(self, python: Path, work: Path, config: Mapping[str, Any]) -> dict[str, Any]:
        config_path = work / "driver_config.json"
        config_path.write_text(json.dumps(config, indent=1))
        output = Path(config["output"])
        output.unlink(missing_ok=True)
        with open(work / "acebench.log", "ab") as log:
            process = await asyncio.create_subprocess_exec(
                str(python), "-c", DRIVER, str(config_path), stdin=asyncio.subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=work, env=self._driver_env(), start_new_session=True)
            try:
                code = await asyncio.wait_for(process.wait(), self.settings.timeout_s)
            except asyncio.TimeoutError:
                _kill_group(process.pid)
                await process.wait()
                raise AceBenchError(f"ACEBench did not finish within acebench.timeout_s={self.settings.timeout_s} s "
                                    f"(log: {work / 'acebench.log'})") from None
            except BaseException:
                _kill_group(process.pid)
                await process.wait()
                raise
        report = json.loads(output.read_text()) if output.is_file() else None
        if report is None or code not in (0, IMPORT_FAILED):
            tail = (work / "acebench.log").read_text(errors="replace")[-3000:]
            raise AceBenchError(f"the ACEBench driver exited with {code} (log: {work / 'acebench.log'}):\n{tail}")
        return report


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


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
                   root: Path, commit: Optional[str], user: Any) -> BenchmarkScore:
    """Per category: ACEBench's end-to-end accuracy in percent (mean over trials); the score is the
    mean over categories (ACEBench's agent_summary). Process accuracy and failed runs in the notes;
    labelled off-protocol when ``user`` (a tau2_bench.UserSimulator) is the model under test."""
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
    score = sum(groups.values()) / len(groups) if groups else None
    return BenchmarkScore(name, score, sum(len(r) for r in records.values()),
                          sum(len(x.samples) for r in records.values() for x in r), groups,
                          metric="accuracy", notes=notes, off_protocol=user.off_protocol)
