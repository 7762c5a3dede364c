"""Reasoning-Gym at hard difficulty, four categories, generated and scored by ``reasoning-gym``.

Items: each task of a category (``data/rg_hard.json``: the 100 tasks of the Reasoning-Gym paper's
hard configurations, parameters from that repository's ``eval/yaml/hard``, grouped as arXiv
2601.22975 Table 3 does) is instantiated with ``reasoning_gym.create_dataset(task, seed=S,
size=N, **hard_params)``; ``episodes`` items per task (the released in-loop evaluator,
``eval_configs/gem_eval_inloop.yaml``: 4 per task, T 0.6, top-p 0.8, top-k 20, 8,192 tokens).
The prompt is Reasoning-Gym's own default instruction (``reasoning_gym.utils.SYSTEM_PROMPTS``)
around the question, as the released evaluator's ``rg`` prompt puts it; the answer is read by
the package's ``extract_answer`` (the last ``<answer>...</answer>``; none: failure) from the text
after any reasoning, and scored by the dataset's ``score_answer``; a success is a score of 1.
Category score = pooled win rate over all episodes of the category's tasks. A category with a task
that could not be built (dataset or items) gets no score: it is reported skipped with the reason,
never scored over the tasks that did build.

Protocols (``eval.protocol``, spade/eval/protocol.py): the above is ``spade``, the default. Under
``in_loop`` and ``offline`` the benchmark is played as the released evaluator plays it
(``rg_released.py``): the released item pool and draw, the boxed suffix on the question, the
``<answer>`` extraction with the ``\\boxed{}`` fallback, the package's scorer for every task, and an
episode whose scorer raises left out of the count; ``in_loop`` 4 episodes per task, ``offline`` 8.

Known scorer defects of reasoning-gym 0.1.25, and what ``spade`` does instead (the released
protocols keep the package's behaviour, as the released runs did):
- ``game_of_life_halting``: its scorer returns 1.0 for any non-empty answer. We do not call it;
  the answer succeeds when it equals the item's gold answer ("True"/"False"), case-insensitively.
- ``prime_factorization``: its scorer raises ValueError on a non-numeric factor. A raising scorer
  (this or any other task) counts as a failure, with the error recorded in the sample's detail.
- ``knight_swap`` (and any task): generation may fail at hard settings. An index that fails to
  generate is replaced by the next index of the same dataset (at most ``episodes`` extra tries);
  replacements are recorded in the item's meta; a task that still yields fewer than ``episodes``
  items has failed to build, and its category is not scored.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional, Sequence

from .extract import strip_thinking
from .benchmark import Benchmark
from .protocol import RELEASED, SPADE, check_protocol
from .rg_released import (EXCLUDED, POOL_SEED, POOL_SIZE, episode_indices, released_answer, released_question,
                          released_score)
from .types import BenchmarkScore, BenchmarkUnavailable, EvalItem, ItemRecord, SampleRecord, SamplingSettings

log = logging.getLogger("spade.eval")
DATA_FILE = Path(__file__).parent / "data" / "rg_hard.json"
CATEGORIES = ("math", "algorithmic", "cognition", "logic")
# the released in-loop settings (eval_configs/gem_eval_inloop.yaml; top-p/top-k from gem_evaluator.py)
RG_EPISODES = 4
RG_SAMPLING = SamplingSettings(n=1, temperature=0.6, top_p=0.8, top_k=20, max_new_tokens=8192)
WIN = 1.0 - 1e-9  # the released evaluator's win: a full-credit score


def rg_prompt(question: str) -> str:
    """Reasoning-Gym's default instruction with the problem after its first sentence (the released
    evaluator's ``rg`` prompt, a user message)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    first, rest = SYSTEM_PROMPTS["default"].split("\n", 1)
    return f"{first}\nProblem: {question}\n{rest.rstrip()}"


def rg_answer(text: str) -> Optional[str]:
    """The package's ``extract_answer`` on the text after any reasoning."""
    from reasoning_gym.utils import extract_answer

    return extract_answer(strip_thinking(text))


@lru_cache(maxsize=1)
def hard_settings() -> dict[str, Any]:
    return json.loads(DATA_FILE.read_text())


def tasks_of(category: str) -> list[str]:
    return list(hard_settings()["categories"][category])


def score_rg_answer(task: str, dataset: Any, entry: dict, answer: Optional[str]) -> tuple[float, dict]:
    """The package's score of ``answer`` for ``entry`` with the documented defects worked around."""
    if answer is None:
        return 0.0, {"reason": "no <answer> tag"}
    if task == "game_of_life_halting":
        gold = str(entry.get("answer", "")).strip().lower()
        return (1.0 if answer.strip().lower() == gold else 0.0), {"scorer": "exact match (package scorer defective)"}
    try:
        return float(dataset.score_answer(answer=answer, entry=entry)), {}
    except Exception as exc:  # noqa: BLE001  (the package's scorer failing = the answer is not right)
        return 0.0, {"scorer_error": f"{type(exc).__name__}: {exc}"[:300]}


@dataclass
class _Task:
    dataset: Any
    entries: dict[int, dict]


class ReasoningGymHard(Benchmark):
    metric = "win rate"

    def __init__(self, category: str, *, episodes: int = RG_EPISODES, sampling: SamplingSettings = RG_SAMPLING,
                 tasks: Optional[Sequence[str]] = None, protocol: str = SPADE):
        if category not in CATEGORIES:
            raise ValueError(f"unknown Reasoning-Gym category {category!r}; one of {CATEGORIES}")
        self.protocol = check_protocol(protocol)
        self.released = self.protocol in RELEASED
        self.category = category
        self.name = f"rg_{category}"
        self.episodes = episodes
        self.sampling = sampling
        self.tasks = list(tasks) if tasks is not None else tasks_of(category)
        self._loaded: dict[str, _Task] = {}

    def _dataset(self, task: str, seed: int) -> _Task:
        if task not in self._loaded:
            import reasoning_gym

            params = hard_settings()["params"][task]
            if self.released:
                dataset = reasoning_gym.create_dataset(task, seed=POOL_SEED, size=POOL_SIZE, **params)
            else:
                dataset = reasoning_gym.create_dataset(task, seed=seed, size=2 * self.episodes, **params)
            self._loaded[task] = _Task(dataset, {})
        return self._loaded[task]

    def _indices(self, task: str, seed: int) -> list[int]:
        """The dataset indices to try, in order: ``spade`` 0, 1, ...; the released protocols draw
        from the pool. Either way ``episodes`` extra tries cover entries that fail to generate."""
        if self.released:
            return episode_indices(task, seed, 2 * self.episodes)
        return list(range(2 * self.episodes))

    def prompt(self, question: str) -> str:
        return rg_prompt(released_question(question) if self.released else question)

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        try:
            import reasoning_gym  # noqa: F401
        except ImportError as exc:
            raise BenchmarkUnavailable(f"reasoning-gym is not installed ({exc}); pip install reasoning-gym==0.1.25") from None
        items: list[EvalItem] = []
        # --limit N: N episodes of each task (so every task of the category still counts)
        episodes = self.episodes if limit is None else min(self.episodes, limit)
        self.absent: dict[str, str] = {}
        for task in self.tasks:
            try:
                holder = self._dataset(task, seed)
            except Exception as exc:  # noqa: BLE001
                self.absent[task] = f"{type(exc).__name__}: {exc}"[:200]
                log.warning("reasoning-gym %s: cannot build the dataset: %s", task, exc)
                continue
            kept, failures = 0, 0
            for episode, index in enumerate(self._indices(task, seed)):
                if kept >= episodes:
                    break
                try:
                    entry = holder.dataset[index]
                except Exception as exc:  # noqa: BLE001  (generation failure: take the next index)
                    failures += 1
                    log.info("reasoning-gym %s[%d] failed to generate: %s", task, index, exc)
                    continue
                holder.entries[index] = entry
                # a released draw may repeat an index: the episode number keeps item ids unique
                item_id = f"{task}/{episode}:{index}" if self.released else f"{task}/{index}"
                items.append(EvalItem(item_id, ({"role": "user", "content": self.prompt(entry["question"])},),
                                      reference=index, group=task, meta={"replaced_failures": failures}))
                kept += 1
            if kept < episodes:
                self.absent[task] = f"{kept} of {episodes} items generated ({failures} failures)"
        return items

    async def score(self, item: EvalItem, text: str) -> SampleRecord:
        task = item.group
        holder = self._loaded[task]
        entry = holder.entries[item.reference]
        if self.released:
            answer, source = released_answer(strip_thinking(text))
            score, detail = released_score(holder.dataset, entry, answer)
            detail = {"answer_from": source, **detail}
        else:
            answer = rg_answer(text)
            score, detail = score_rg_answer(task, holder.dataset, entry, answer)
        return SampleRecord(text, answer, score, score >= WIN, detail=detail)

    def summarize(self, records: Sequence[ItemRecord]) -> BenchmarkScore:
        """Pooled win rate per category; under the released protocols a sample whose scorer raised
        is left out (the released evaluator's episode error), counted in ``notes["excluded"]``."""
        excluded = sum(1 for r in records for s in r.samples if s.detail.get(EXCLUDED))
        if excluded:
            records = [ItemRecord(r.item_id, r.group, tuple(s for s in r.samples if not s.detail.get(EXCLUDED)),
                                  r.seed, r.weight_version) for r in records]
            records = [r for r in records if r.samples]
        result = super().summarize(records)
        absent = getattr(self, "absent", {})
        notes = {f"absent {task}": why for task, why in absent.items()}
        if excluded:
            notes["excluded"] = f"{excluded} sample(s) left out: the package's scorer raised (released protocol)"
        if absent:
            reason = (f"not scored: {len(absent)} of {len(self.tasks)} tasks failed to build "
                      f"({', '.join(sorted(absent))}); a category score needs every task")
            return BenchmarkScore(result.name, None, result.items, result.samples, result.groups, skipped=reason,
                                  metric=self.metric, notes=notes)
        return BenchmarkScore(result.name, result.score, result.items, result.samples, result.groups,
                              metric=self.metric, notes=notes)
