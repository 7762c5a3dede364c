"""Hint leakage (SPEC 7.1, beyond the paper): how much the privileged hint gives away.

Per environment, from its kept trajectories:

* ``winning_actions``: the final actions of won episodes (return > 0), either arm, normalised
  (``\\boxed{}`` removed, lower case, whitespace collapsed);
* ``hint_contains_answer``: the normalised hint contains one of them as a whole phrase (word
  boundaries on both sides; answers shorter than 2 characters count only inside ``\\boxed{}`` or
  quotes in the hint, since a lone digit matches almost any text). None when nothing was won;
* ``hint_one_turn_win_rate`` / ``nohint_one_turn_win_rate``: share of the arm's kept episodes won
  in exactly one turn. A hint that lets the agent win at once where it otherwise needs several
  turns has given the answer away.

Per set: the share of hints (among environments with a known winning action) that contain it,
and both one-turn win rates.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

_BOX = re.compile(r"\\boxed\s*\{(.*)\}\s*$", re.DOTALL)


def normalise(action: str) -> str:
    text = action.strip()
    match = _BOX.fullmatch(text) or _BOX.search(text)
    if match:
        text = match.group(1)
    return " ".join(text.lower().split())


def contains_answer(hint: str, answer: str) -> bool:
    answer = normalise(answer)
    if not answer:
        return False
    text = " ".join(hint.lower().split())
    if len(answer) < 2:
        quoted = re.escape(answer)
        return re.search(r"\\boxed\s*\{\s*" + quoted + r"\s*\}|[\"'`]" + quoted + r"[\"'`]", text) is not None
    pattern = r"(?<![a-z0-9])" + re.escape(answer) + r"(?![a-z0-9])"
    return re.search(pattern, text) is not None


def one_turn_win_rate(episodes: list[Any]) -> float | None:
    if not episodes:
        return None
    return sum(1 for e in episodes if e.won and len(e.turns) == 1) / len(episodes)


def hint_leakage(hint: str, episodes: Iterable[Any]) -> dict[str, Any]:
    episodes = list(episodes)
    winning = sorted({normalise(e.final_action) for e in episodes if e.won and e.final_action})
    contains = None if not winning or not hint.strip() else any(contains_answer(hint, a) for a in winning)
    return {"winning_actions": winning, "hint_contains_answer": contains,
            "hint_one_turn_win_rate": one_turn_win_rate([e for e in episodes if e.arm == "hint"]),
            "nohint_one_turn_win_rate": one_turn_win_rate([e for e in episodes if e.arm == "nohint"])}
