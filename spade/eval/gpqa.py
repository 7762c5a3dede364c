"""GPQA-Diamond: multiple-choice accuracy, options shuffled under the seed.

Data: ``gpqa_diamond.csv`` (the CSV of the published GPQA release; .jsonl/.json/.parquet with the
same keys also work) in the data directory, with ``Question``, ``Correct Answer``, ``Incorrect
Answer 1``..``3`` and ``Record ID`` (the row number when absent). The options of each item are
shuffled by a generator seeded from the run seed and the record id, so the correct letter is
reproducible and spread evenly. The items are never copied into results: the jsonl keeps the
model's text and the scores only (GPQA's licence asks that items are not republished).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Optional

from .data_files import field, find_file, read_rows
from .extract import choice_letter
from .types import Benchmark, EvalItem, SampleRecord, SamplingSettings, BenchmarkUnavailable

LETTERS = "ABCD"
GPQA_SAMPLING = SamplingSettings(n=2, temperature=0.7, top_p=1.0, top_k=None, max_new_tokens=16384)
INSTRUCTION = ("Answer the multiple-choice question below. Think it through, then give the letter of "
               "the correct option as \\boxed{X} (X one of A, B, C, D).")


def shuffled_options(correct: str, incorrect: list[str], seed: int, record_id: str) -> tuple[list[str], str]:
    """The four options in a seeded order and the letter of the correct one."""
    digest = hashlib.sha256(f"{seed}\0{record_id}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    options = [correct, *incorrect]
    order = list(range(4))
    rng.shuffle(order)
    shuffled = [options[i] for i in order]
    return shuffled, LETTERS[order.index(0)]


class GPQADiamond(Benchmark):
    name = "gpqa_diamond"

    def __init__(self, *, data_dir: Optional[Path] = None, sampling: SamplingSettings = GPQA_SAMPLING):
        self.data_dir = data_dir
        self.sampling = sampling

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        path = find_file(self.data_dir, ["gpqa_diamond", "gpqa-diamond"], "GPQA-Diamond")
        items = []
        for index, row in enumerate(read_rows(path)):
            question = field(row, ["Question", "question"])
            correct = field(row, ["Correct Answer", "correct_answer"])
            wrong = [field(row, [f"Incorrect Answer {k}", f"incorrect_answer_{k}"]) for k in (1, 2, 3)]
            if question is None or correct is None or any(w is None for w in wrong):
                raise BenchmarkUnavailable(f"{path}: row {index + 1} lacks Question / Correct Answer / "
                                           "Incorrect Answer 1-3")
            record_id = str(field(row, ["Record ID", "record_id", "id"], index))
            options, letter = shuffled_options(str(correct).strip(), [str(w).strip() for w in wrong], seed, record_id)
            body = "\n".join(f"{LETTERS[i]}) {text}" for i, text in enumerate(options))
            prompt = f"{INSTRUCTION}\n\n{str(question).strip()}\n\n{body}"
            items.append(EvalItem(record_id, ({"role": "user", "content": prompt},), reference=letter))
        return items[:limit] if limit is not None else items

    async def score(self, item: EvalItem, text: str) -> SampleRecord:
        answer = choice_letter(text, LETTERS)
        correct = answer == item.reference
        return SampleRecord(text, answer, 1.0 if correct else 0.0, correct, detail={"gold": item.reference})
