"""Reasoning-Gym hard as the released evaluator plays it (protocols ``in_loop`` and ``offline``).

Both released configurations run the same environment and evaluator for Reasoning-Gym
(``spade/core/envs/gem_adapter.py`` ``SpadeReasoningGymEnv``, ``spade/core/eval/gem_evaluator.py``);
only the episodes per task differ (4 in-loop, 8 offline). What they do, in our words:

- item pool: ``reasoning_gym.create_dataset(task, seed=42, size=500, **hard_params)``; each episode
  draws one entry of the pool uniformly at random, with replacement. The released draw uses the
  process-wide ``random`` state, which nothing seeds, so its exact items cannot be recovered; we draw
  with a ``random.Random`` seeded by the run seed and the task (:func:`episode_indices`);
- prompt: the environment appends a blank line and the boxed instruction :data:`BOXED_SUFFIX` to the
  question, and the evaluator puts that into Reasoning-Gym's default instruction (the ``rg`` prompt,
  as :func:`~spade.eval.reasoning_gym_bench.rg_prompt` builds it);
- answer: the content of the last ``<answer>...</answer>`` (tag case ignored, content trimmed);
  without one, the last ``\\boxed{...}`` as GEM's ``extract_last_boxed_answer`` reads it (the last
  ``\\boxed`` directly followed by a balanced ``{...}``); otherwise none;
- score: the dataset's own ``score_answer`` for every task (called with None when there is no
  answer); a scorer that raises makes the episode an error, which the released evaluator leaves out
  of the task's count (:data:`EXCLUDED`), never a loss.
"""

from __future__ import annotations

import random
import re
from typing import Any, Optional

from .extract import balancing_brace

POOL_SEED = 42  # the seed every rg:<task>-hard environment is registered with
POOL_SIZE = 500  # SpadeReasoningGymEnv's default dataset size
# appended to the question by the released environment's reset (the prompt suffix)
BOXED_SUFFIX = "\n\nPut your final answer within \\boxed{}."
EXCLUDED = "excluded"  # a sample's detail key: the released evaluator counts this episode as an error

_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE)
_BOXED_OPEN = "\\boxed{"


def released_question(question: str) -> str:
    """The question as the released environment hands it to the evaluator."""
    return question + BOXED_SUFFIX


def gem_last_boxed(text: str) -> Optional[str]:
    """GEM's reading of the last ``\\boxed{...}``: from the last ``\\boxed`` (an ``\\fbox`` is found
    but never accepted), braces counted to the balancing ``}``; None when the last ``\\boxed`` is not
    directly followed by ``{`` or its braces never balance. The content is returned untrimmed."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    end = balancing_brace(text, start)
    if end is None:
        return None
    whole = text[start:end + 1]
    return whole[len(_BOXED_OPEN):-1] if whole.startswith(_BOXED_OPEN) else None


def released_answer(text: str) -> tuple[Optional[str], str]:
    """The answer the released environment scores and where it came from (``answer_tag``,
    ``boxed`` or ``none``)."""
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip(), "answer_tag"
    boxed = gem_last_boxed(text)
    return (boxed, "boxed") if boxed is not None else (None, "none")


def released_score(dataset: Any, entry: dict, answer: Optional[str]) -> tuple[float, dict]:
    """The dataset's ``score_answer`` as the released environment calls it; a raising scorer gives
    an excluded sample (the released evaluator's episode error)."""
    try:
        return float(dataset.score_answer(answer=answer, entry=entry)), {}
    except Exception as exc:  # noqa: BLE001  (the released evaluator drops the episode)
        return 0.0, {"scorer_error": f"{type(exc).__name__}: {exc}"[:300], EXCLUDED: True}


def episode_indices(task: str, seed: int, count: int) -> list[int]:
    """``count`` pool indices drawn uniformly with replacement, reproducible from ``seed`` and ``task``."""
    rng = random.Random(f"rg-released/{task}/{seed}")
    return [rng.randrange(POOL_SIZE) for _ in range(count)]
