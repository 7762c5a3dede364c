"""The evaluation runner: any ``RolloutEngine``, bounded concurrency, seeded, resumable.

Every sample has its own seed, derived from the run seed, the benchmark, the item id and the
sample index (:func:`sample_seed`), so a result does not depend on batching, concurrency or on
which items an interrupted run had finished. ``DIR/<benchmark>.jsonl`` gets one line per finished
item (all its samples), appended and flushed as soon as the item is done; a rerun with the same
``DIR`` reads the file, keeps the finished items and runs only the rest. A line cut short by a kill
is dropped (and cut from the file) so that the next append starts on a fresh line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ..rollout.engine import GenerationRequest, RolloutEngine, SamplingParams
from ..agent.reasoning import prompt_opens_reasoning
from .benchmark import Benchmark
from .chat_interface import ChatModelLike, Completion
from .protocol import DEFAULT_PROTOCOL
from .types import BenchmarkScore, BenchmarkUnavailable, EvalItem, ItemRecord, SamplingSettings

SUMMARY_FILE = "summary.json"


class EvalError(RuntimeError):
    """The evaluation cannot go on as asked (e.g. resuming a directory written under another seed)."""


def sample_seed(seed: int, benchmark: str, item_id: str, index: int) -> int:
    digest = hashlib.sha256(f"{seed}\0{benchmark}\0{item_id}\0{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class ChatModel:
    """The ``ChatModelLike`` the benchmarks are run on: a chat front end over a ``RolloutEngine``
    that renders messages with the tokenizer's chat template, bounds how many generations are in
    flight (``concurrency``), decodes the result. ``max_context_tokens`` caps prompt plus
    completion (the completion budget shrinks to fit)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, *, concurrency: int = 8,
                 max_context_tokens: Optional[int] = None, stop_token_ids: Sequence[int] = (),
                 chat_template_kwargs: Optional[Mapping[str, Any]] = None):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.concurrency = concurrency
        self.max_context_tokens = max_context_tokens
        self.stop_token_ids = tuple(stop_token_ids)
        self.template_kwargs = dict(chat_template_kwargs or {})
        self._slots: Optional[asyncio.Semaphore] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.generated_tokens = 0

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._slots, self._loop = asyncio.Semaphore(self.concurrency), loop
        return self._slots

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Optional[list] = None) -> list[int]:
        return list(self.tokenizer(self._render_text(messages, tools), add_special_tokens=False)["input_ids"])

    def _render_text(self, messages: Sequence[Mapping[str, Any]], tools: Optional[list] = None) -> str:
        kwargs = dict(self.template_kwargs)
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                  add_generation_prompt=True, **kwargs)

    async def complete(self, messages: Sequence[Mapping[str, Any]], sampling: SamplingSettings, seed: int,
                       tools: Optional[list] = None) -> Completion:
        rendered = self._render_text(messages, tools)
        prompt = list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])
        opens = prompt_opens_reasoning(rendered)
        budget = sampling.max_new_tokens
        if self.max_context_tokens is not None:
            budget = min(budget, self.max_context_tokens - len(prompt))
        if budget < 1:
            return Completion("", "length", 0, len(prompt), self.engine.weight_version, opens)
        params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                max_new_tokens=budget, stop_token_ids=self.stop_token_ids, seed=seed)
        async with self._semaphore():
            result = await self.engine.generate(GenerationRequest(tuple(prompt), params))
        self.generated_tokens += len(result.token_ids)
        text = self.tokenizer.decode(list(result.token_ids), skip_special_tokens=True)
        return Completion(text, result.finish_reason, len(result.token_ids), len(prompt), result.weight_version,
                          opens)


# ---------------------------------------------------------------------------- results files


def results_path(out_dir: Path, benchmark: str) -> Path:
    return Path(out_dir) / f"{benchmark}.jsonl"


def read_records(path: Path) -> dict[str, ItemRecord]:
    """Finished items of a results file; a trailing partial line (a killed run) is cut off."""
    if not path.is_file():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with open(path, "r+b") as handle:
            handle.truncate(end)
    records: dict[str, ItemRecord] = {}
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            record = ItemRecord.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError):
            continue
        records[record.item_id] = record
    return records


def record_line(record: ItemRecord) -> str:
    """One results line: UTF-8 as written, or with ``\\uXXXX`` escapes when the record holds a lone
    surrogate (a call's arguments decoded from a model's ``"\\ud800"``), which UTF-8 cannot encode."""
    line = json.dumps(record.to_json(), ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(record.to_json())
    return line


def _append(path: Path, record: ItemRecord) -> None:
    line = (record_line(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


Progress = Callable[[str, int, int], None]


def stderr_progress(name: str, done: int, total: int) -> None:
    if sys.stderr.isatty():
        print(f"\r  {name}: {done}/{total} items", end="\n" if done == total else "", file=sys.stderr, flush=True)
    elif done == total or done % max(1, total // 10) == 0:
        print(f"  {name}: {done}/{total} items", file=sys.stderr, flush=True)


async def run_benchmark(benchmark: Benchmark, model: ChatModelLike, *, seed: int = 0, limit: Optional[int] = None,
                        out_dir: Optional[Path] = None, progress: Optional[Progress] = None) -> BenchmarkScore:
    """Evaluate one benchmark; skipped (with the reason) when its data or package is missing.
    A benchmark that drives an outside harness over HTTP (tau2) has its own ``run``, called instead."""
    own_run = getattr(benchmark, "run", None)
    if callable(own_run):
        return await own_run(model, seed=seed, limit=limit, out_dir=out_dir, progress=progress)
    try:
        items = benchmark.load(seed, limit)
    except BenchmarkUnavailable as exc:
        return BenchmarkScore(benchmark.name, None, skipped=str(exc), metric=benchmark.metric)
    if not items:
        return BenchmarkScore(benchmark.name, None, skipped="no items", metric=benchmark.metric)
    path = results_path(out_dir, benchmark.name) if out_dir is not None else None
    done: dict[str, ItemRecord] = {}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        done = read_records(path)
        other = sorted({r.seed for r in done.values()} - {seed})
        if other:
            raise EvalError(f"{path} was written with --seed {other[0]}, not {seed}: use another --out "
                            "or the same seed")
    wanted = {item.item_id for item in items}
    finished = sum(1 for key in done if key in wanted)
    if progress:
        progress(benchmark.name, finished, len(items))

    async def one_item(item: EvalItem) -> ItemRecord:
        seeds = [sample_seed(seed, benchmark.name, item.item_id, k) for k in range(benchmark.sampling.n)]
        samples = await asyncio.gather(*(benchmark.play(item, model, s) for s in seeds))
        return ItemRecord(item.item_id, item.group, tuple(samples), seed, model.engine.weight_version)

    tasks: list[asyncio.Future] = []
    try:
        tasks = [asyncio.ensure_future(one_item(item)) for item in items if item.item_id not in done]
        for next_done in asyncio.as_completed(tasks):
            record = await next_done
            done[record.item_id] = record
            if path is not None:
                _append(path, record)
            finished += 1
            if progress:
                progress(benchmark.name, finished, len(items))
    finally:
        for task in tasks:
            task.cancel()
        await benchmark.close()
    return benchmark.summarize([done[item.item_id] for item in items])


async def run_suite(benchmarks: Iterable[Benchmark], model: ChatModelLike, *, seed: int = 0,
                    limit: Optional[int] = None, out_dir: Optional[Path] = None,
                    progress: Optional[Progress] = None, info: Optional[Mapping[str, Any]] = None
                    ) -> dict[str, BenchmarkScore]:
    """Run the benchmarks one after another; writes ``DIR/summary.json`` after each. ``info``'s
    ``protocol`` is recorded there; a directory written under another protocol is not resumed."""
    if out_dir is not None and (info or {}).get("protocol"):
        _same_protocol(Path(out_dir), str(info["protocol"]))  # type: ignore[index]
    scores: dict[str, BenchmarkScore] = {}
    started = time.time()
    for benchmark in benchmarks:
        scores[benchmark.name] = await run_benchmark(benchmark, model, seed=seed, limit=limit,
                                                     out_dir=out_dir, progress=progress)
        if out_dir is not None:
            write_summary(Path(out_dir), scores, {**dict(info or {}), "seed": seed, "limit": limit,
                                                  "elapsed_s": round(time.time() - started, 3)})
    return scores


def _same_protocol(out_dir: Path, protocol: str) -> None:
    """An EvalError when ``out_dir`` holds results of another protocol (a summary without the key
    predates protocols: spade's own)."""
    path = Path(out_dir) / SUMMARY_FILE
    if not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text()).get("protocol") or DEFAULT_PROTOCOL
    except (ValueError, AttributeError):
        return
    if recorded != protocol:
        raise EvalError(f"{out_dir} holds results of eval protocol {recorded!r}, not {protocol!r}: "
                        "use another --out or the same protocol")


def write_summary(out_dir: Path, scores: Mapping[str, BenchmarkScore], info: Mapping[str, Any]) -> Path:
    path = Path(out_dir) / SUMMARY_FILE
    existing: dict[str, Any] = {}
    if path.is_file():
        try:
            existing = json.loads(path.read_text()).get("benchmarks", {})
        except (ValueError, AttributeError):
            existing = {}
    merged = {**existing, **{name: score.to_json() for name, score in scores.items()}}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**dict(info), "benchmarks": merged}, indent=1))
    os.replace(tmp, path)
    return path


def read_summary(out_dir: Path) -> dict[str, Any]:
    return json.loads((Path(out_dir) / SUMMARY_FILE).read_text())


def format_table(scores: Mapping[str, BenchmarkScore]) -> str:
    """A plain-text table: benchmark, score (or skipped: reason), items, samples, sub-scores."""
    rows = [("benchmark", "score", "items", "samples", "groups")]
    for name, s in scores.items():
        value = f"{s.score:.1f}" if s.score is not None else f"skipped: {s.skipped}"
        if s.off_protocol:
            value += f" ({s.off_protocol.split(':')[0]}: not a paper number)"
        groups = " ".join(f"{g}={v:.0f}" for g, v in list(s.groups.items())[:6])
        rows.append((name, value, str(s.items), str(s.samples), groups))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + ("  " + r[4] if r[4] else "") for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
