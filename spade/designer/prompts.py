"""What the Environment Designer is asked (SPEC section 5), in this project's own words.

Two calls per environment: the **designer** call writes a complete environment class grounded in
one corpus document, for one skill, informed by the memory block; the **hint** call reads the
finished source and writes a short privileged hint for the hinted arm of the agent.
"""

from __future__ import annotations

from dataclasses import dataclass

from .skills import Skill

Message = dict[str, str]

DESIGNER_SYSTEM = """You design interactive text games that train a reasoning agent. Each game is a \
complete Python module that defines one environment class. The agent never sees your code: it \
only reads the observations your environment returns and answers with one action per turn.

The environment class must:
- have a name ending in `Env` and take `max_turns` as a keyword argument of `__init__` (with a \
default), stored as `self.max_turns`;
- implement `reset(self, seed=None)` returning `(observation: str, info: dict)`, and \
`step(self, action: str)` returning `(observation: str, reward: float, terminated: bool, \
truncated: bool, info: dict)`;
- keep hidden state that the agent must uncover or reason about over several turns: a game that \
can be won in one move, or whose answer is written in the opening observation, is a failure;
- draw every random choice from `random.Random(seed)` created in `reset`, so the same seed always \
gives the same game; no other source of randomness, no clock, no files, no network;
- use the Python standard library only;
- receive actions as text of the form `\\boxed{...}` and parse them leniently; an invalid action \
gets an explanatory observation and costs a turn, it never raises;
- give rewards in [0, 1]: small partial rewards for real progress are welcome, 1.0 only for full \
success (which terminates the episode), 0.0 for a final failure; set `truncated=True` when \
`max_turns` runs out;
- make the answer derivable from the interaction alone, and return JSON-serialisable info dicts.

The opening observation explains the rules and the exact action syntax, but never the answer or \
a formula that gives it away. Reply with your reasoning, then the whole module in one \
```python fenced block."""

HINT_SYSTEM = """You write privileged hints for interactive text games. You will read the full \
source of a game. Write a short hint (at most four sentences) that would help a capable player: \
the key insight, a good plan, and the exact answer format the game accepts. Never state the \
secret answer itself, any value that is only known after reset, or anything that makes playing \
unnecessary. Reply with the hint only."""


@dataclass(frozen=True)
class DesignerRequest:
    """Everything one designer attempt is conditioned on."""

    skill: Skill
    document: str | None  # None in the no-corpus ablation
    memory_block: str = ""  # "" when memory is empty or disabled
    difficulty: str = "medium"
    max_turns: int = 25


DIFFICULTIES = {
    "easy": "A capable agent should win most of the time (about 70-85% of attempts).",
    "medium": "A capable agent should win about half the time: neither trivial nor hopeless.",
    "hard": "A capable agent should win only occasionally (about 15-30% of attempts).",
}


def designer_messages(request: DesignerRequest) -> list[Message]:
    if request.difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {request.difficulty!r}: choose one of {', '.join(DIFFICULTIES)}")
    parts = [f"## Skill to train: {request.skill.name}\n{request.skill.description}"]
    if request.document is not None:
        parts.append("## Source document\nGround the game in the ideas, objects or procedures of this "
                     "document. The game must be playable without reading it.\n\n"
                     f"<document>\n{request.document}\n</document>")
    if request.memory_block:
        parts.append(request.memory_block)
    parts.append(f"## Difficulty\n{DIFFICULTIES[request.difficulty]} Episodes end after at most "
                 f"{request.max_turns} turns, so a good game is won in roughly 4 to "
                 f"{max(4, request.max_turns - 2)} well-chosen actions.")
    parts.append("Now write the environment.")
    return [{"role": "system", "content": DESIGNER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def hint_messages(source: str) -> list[Message]:
    return [{"role": "system", "content": HINT_SYSTEM},
            {"role": "user", "content": f"```python\n{source}\n```\n\nWrite the hint."}]


def clean_hint(response: str, max_chars: int = 1_000) -> str:
    """The hint text: reasoning blocks and fences dropped, whitespace collapsed, length capped."""
    text = response
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    text = text.replace("```", " ")
    text = " ".join(text.split())
    return text[:max_chars]
