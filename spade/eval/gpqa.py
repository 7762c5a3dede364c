"""GPQA-Diamond: multiple-choice accuracy, as the released in-loop evaluator plays it.

Data: ``gpqa_diamond.csv`` (the CSV of the published GPQA release; .jsonl/.json/.parquet with the
same keys also work) in the data directory, with ``Question``, ``Correct Answer``, ``Incorrect
Answer 1``..``3`` and ``Record ID`` (the row number when absent). The items are never copied into
results: the jsonl keeps the model's text and the scores only (GPQA's licence asks that items are
not republished).

Protocol (the released ``mcq:GPQA-Diamond-official`` task, ``eval_configs/gem_eval_inloop.yaml``:
396 episodes = 2 passes over the 198 items, T 0.7, top-p 0.8, top-k 20, 16,384 tokens):
- options: ``[correct, incorrect 1, incorrect 2, incorrect 3]`` shuffled by ``random.Random(42 + i)``
  with ``i`` the item's row in the file, so the letters are the released ones whatever the run seed;
- prompt: the General-Reasoner GPQA template the released code uses (question, ``A: ...`` lines,
  step-by-step with the letter alone in ``\\boxed{}``);
- answer: the letter in the last ``\\boxed{}`` of the answer (after any reasoning), nothing else.

Protocols (``eval.protocol``): ``spade`` (default) and ``in_loop`` are the above. ``offline`` is the
released offline suite (``eval_offline/configs/games.yaml``, ``eval_offline/suites/gpqa_diamond.py``):
8 samples at T 0.7, top-p 0.95, no top-k, 32,768 tokens; one ``random.Random(42)`` shuffles the
option order of every row in turn; the prompt lists the options as ``A. ...`` and asks for
``\\boxed{LETTER}``; the answer is the letter of the last ``\\boxed{A}``..``\\boxed{D}`` (exactly
that), else the first "answer is X" / "Answer: X" (either case).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Optional

from .data_files import field, find_file, read_rows
from .extract import boxed_choice
from .benchmark import Benchmark
from .extract import strip_thinking
from .protocol import OFFLINE, SPADE, check_protocol
from .types import EvalItem, SampleRecord, SamplingSettings, BenchmarkUnavailable

LETTERS = "ABCD"
SHUFFLE_SEED = 42  # the released GpqaOfficialMcqEnv's shuffle_seed
GPQA_SAMPLING = SamplingSettings(n=2, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=16384)
# General-Reasoner's GPQA query template (the benchmark prompt the paper's numbers were measured with)
TEMPLATE = ("{question}\n\nA: {a}\nB: {b}\nC: {c}\nD: {d}\n\n"
            "Please reason step by step, and put your final answer within \\boxed{{}}.\n"
            "Please only provide the letter of the answer in the box.")


def shuffled_options(correct: str, incorrect: list[str], row: int,
                     shuffle_seed: int = SHUFFLE_SEED) -> tuple[list[str], str]:
    """The four options in the released order for the item at ``row`` and the correct letter."""
    options = [correct, *incorrect]
    random.Random(shuffle_seed + row).shuffle(options)
    return options, LETTERS[options.index(correct)]


def gpqa_prompt(question: str, options: list[str]) -> str:
    a, b, c, d = options
    return TEMPLATE.format(question=question, a=a, b=b, c=c, d=d)


# The released offline suite's prompt (eval_offline/suites/gpqa_diamond.py), reproduced as protocol data
OFFLINE_INSTRUCTION = ("Please reason step by step, and put your final answer within \\boxed{}. "
                       "Specifically, you should provide your final answer in the format "
                       "\\boxed{LETTER} where LETTER is one of ABCD.")
_OFFLINE_BOX = re.compile(r"\\boxed\{([A-D])\}")
_OFFLINE_PHRASE = re.compile(r"(?:answer is|Answer:)\s*([A-D])\b", re.IGNORECASE)


def offline_prompt(question: str, options: list[str]) -> str:
    listed = "\n".join(f"{LETTERS[i]}. {option}" for i, option in enumerate(options))
    return f"{question}\n\n{listed}\n\n{OFFLINE_INSTRUCTION}"


def offline_choice(text: str) -> Optional[str]:
    """The offline suite's letter: the last exact ``\\boxed{A-D}``, else the first answer phrase."""
    text = strip_thinking(text)
    boxed = _OFFLINE_BOX.findall(text)
    if boxed:
        return boxed[-1].upper()
    phrase = _OFFLINE_PHRASE.search(text)
    return phrase.group(1).upper() if phrase else None


def offline_order(rng: random.Random, correct: str, incorrect: list[str]) -> tuple[list[str], str]:
    """One row's options as the offline suite orders them with its single running ``rng``."""
    choices = [correct, *incorrect]
    order = list(range(4))
    rng.shuffle(order)
    return [choices[j] for j in order], LETTERS[order.index(0)]


class GPQADiamond(Benchmark):
    name = "gpqa_diamond"

    def __init__(self, *, data_dir: Optional[Path] = None, sampling: SamplingSettings = GPQA_SAMPLING,
                 shuffle_seed: int = SHUFFLE_SEED, protocol: str = SPADE):
        self.protocol = check_protocol(protocol)
        self.data_dir = data_dir
        self.sampling = sampling
        self.shuffle_seed = shuffle_seed

    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        path = find_file(self.data_dir, ["gpqa_diamond", "gpqa-diamond"], "GPQA-Diamond")
        items = []
        running = random.Random(self.shuffle_seed)  # the offline suite's one shuffler for all rows
        for index, row in enumerate(read_rows(path)):
            question = field(row, ["Question", "question"])
            correct = field(row, ["Correct Answer", "correct_answer"])
            wrong = [field(row, [f"Incorrect Answer {k}", f"incorrect_answer_{k}"]) for k in (1, 2, 3)]
            if question is None or correct is None or any(w is None for w in wrong):
                raise BenchmarkUnavailable(f"{path}: row {index + 1} lacks Question / Correct Answer / "
                                           "Incorrect Answer 1-3")
            record_id = str(field(row, ["Record ID", "record_id", "id"], index))
            if self.protocol == OFFLINE:
                options, letter = offline_order(running, str(correct), [str(w) for w in wrong])
                prompt = offline_prompt(str(question), options)
            else:
                options, letter = shuffled_options(str(correct).strip(), [str(w).strip() for w in wrong], index,
                                                   self.shuffle_seed)
                prompt = gpqa_prompt(str(question).strip(), options)
            items.append(EvalItem(record_id, ({"role": "user", "content": prompt},), reference=letter))
        return items[:limit] if limit is not None else items

    async def score(self, item: EvalItem, text: str) -> SampleRecord:
        answer = offline_choice(text) if self.protocol == OFFLINE else boxed_choice(text, LETTERS)
        correct = answer == item.reference
        return SampleRecord(text, answer, 1.0 if correct else 0.0, correct, detail={"gold": item.reference})
