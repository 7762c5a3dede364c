"""AIME 2025 / 2026: Avg@32 of ``\\boxed{}`` answers checked with ``math-verify``.

Protocol (the released ``eval_configs/eval_aime_avg32.yaml`` and ``cmd/eval/prepare_aime_datasets.py``):
32 samples per problem at T 0.7, top-p 0.8, top-k 20, 32,768 tokens; the prompt is the problem with
"\\nPlease reason step by step, and put your final answer within \\boxed{}." appended; the answer is
the last ``\\boxed{}`` of the text after any reasoning (a reply cut inside ``<think>`` has none).

Protocols (``eval.protocol``): ``spade`` (default) and ``in_loop`` are the above. ``offline`` is the
released offline suite (``eval_offline/configs/games.yaml``, ``eval_offline/suites/aime.py``): 64
samples at T 1.0, top-p 0.95, top-k 20, 32,768 tokens, the same prompt; the answer is the last
``\\boxed{...}`` whose content has no braces (a nested box such as ``\\boxed{\\frac{1}{2}}`` is not
read), compared by math-verify with the gold also parsed as a box; when math-verify raises, the two
are compared as integers (else as trimmed strings).

Data: ``aime2025.jsonl`` / ``aime2026.jsonl`` (or .json/.csv/.parquet) in the data directory, one
problem per row with ``problem`` (or ``question``), ``answer`` and an id (``id``, ``problem_idx``
or ``ID``; the row number when absent). This is the layout of the published AIME sets
(e.g. MathArena's and OpenCompass's releases).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .data_files import field, find_file, read_rows
from .extract import last_boxed
from .benchmark import Benchmark
from .extract import strip_thinking
from .protocol import OFFLINE, SPADE, check_protocol
from .types import BenchmarkUnavailable, EvalItem, SampleRecord, SamplingSettings

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
AIME_SAMPLING = SamplingSettings(n=32, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=32768)


def math_equal(gold: str, answer: Optional[str]) -> bool:
    """``math-verify``: is the boxed ``answer`` mathematically equal to ``gold``?"""
    if answer is None:
        return False
    from math_verify import parse, verify

    gold_parsed = parse(f"${gold}$")
    answer_parsed = parse(f"\\boxed{{{answer}}}")
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed))


_FLAT_BOX = re.compile(r"\\boxed\{([^{}]+)\}")


def flat_boxed(text: str) -> Optional[str]:
    """The offline suite's reading: the trimmed content of the last ``\\boxed{...}`` without braces inside."""
    found = _FLAT_BOX.findall(strip_thinking(text))
    return found[-1].strip() if found else None


def offline_equal(gold: str, answer: Optional[str]) -> bool:
    """The offline suite's check: math-verify on both as boxes; if it raises, integers, else strings."""
    if answer is None:
        return False
    try:
        from math_verify import parse, verify

        return bool(verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{answer}}}")))
    except Exception:  # noqa: BLE001  (the released fallback)
        pass
    try:
        return int(answer.strip()) == int(gold.strip())
    except (ValueError, TypeError):
        return answer.strip() == gold.strip()


class AIME(Benchmark):
    metric = "avg@n"

    def __init__(self, year: int, *, data_dir: Optional[Path] = None, sampling: SamplingSettings = AIME_SAMPLING,
                 protocol: str = SPADE):
        self.protocol = check_protocol(protocol)
        self.year = year
        self.name = f"aime{year % 100:02d}"
        self.data_dir = data_dir
        self.sampling = sampling

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        try:
            import math_verify  # noqa: F401
        except ImportError:
            raise BenchmarkUnavailable("math-verify is not installed (pip install math-verify==0.9.0)") from None
        path = find_file(self.data_dir, [f"aime{self.year}", f"aime_{self.year}", f"aime{self.year % 100}"],
                         f"AIME {self.year}")
        items = []
        for index, row in enumerate(read_rows(path)):
            problem = field(row, ["problem", "question"])
            answer = field(row, ["answer"])
            if problem is None or answer is None:
                raise BenchmarkUnavailable(f"{path}: row {index + 1} has no 'problem'/'answer' field")
            item_id = str(field(row, ["id", "problem_idx", "ID"], index))
            items.append(EvalItem(item_id, ({"role": "user", "content": f"{problem}\n{INSTRUCTION}"},),
                                  reference=str(answer)))
        return items[:limit] if limit is not None else items

    async def score(self, item: EvalItem, text: str) -> SampleRecord:
        if self.protocol == OFFLINE:
            answer = flat_boxed(text)
            correct = offline_equal(item.reference, answer)
        else:
            answer = last_boxed(text)
            correct = math_equal(item.reference, answer)
        return SampleRecord(text, answer, 1.0 if correct else 0.0, correct)
