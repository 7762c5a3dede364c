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


def designer_messages(request: DesignerRequest, *, no_corpus: str | None = None) -> list[Message]:
    """The games designer prompt. ``no_corpus`` is None with the corpus on; in the no-corpus
    ablation it names the prompt (``selfplay.no_corpus_prompt``): ``"concepts"`` (the paper's
    code, :func:`concepts_designer_messages`) or ``"corpus_without_document"`` (this prompt with
    no document section)."""
    if no_corpus is not None and no_corpus not in NO_CORPUS_PROMPTS:
        raise ValueError(f"selfplay.no_corpus_prompt: {no_corpus!r} is not allowed; choose one of: "
                         f"{', '.join(NO_CORPUS_PROMPTS)}")
    if no_corpus == "concepts":
        return concepts_designer_messages(request)
    if request.difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {request.difficulty!r}: choose one of {', '.join(DIFFICULTIES)}")
    # The document comes last, after everything the slots of one regeneration have in common
    # (instructions, skill, memory examples, difficulty): their prompts then share one long prefix,
    # which the engines compute once (SGLang's radix cache, the hf engine's shared prefix).
    parts = [f"## Skill to train: {request.skill.name}\n{request.skill.description}"]
    if request.memory_block:
        parts.append(request.memory_block)
    parts.append(f"## Difficulty\n{DIFFICULTIES[request.difficulty]} Episodes end after at most "
                 f"{request.max_turns} turns, so a good game is won in roughly 4 to "
                 f"{max(4, request.max_turns - 2)} well-chosen actions.")
    if request.document is not None:
        parts.append("## Source document\nGround the game in the ideas, objects or procedures of this "
                     "document. The game must be playable without reading it.\n\n"
                     f"<document>\n{request.document}\n</document>")
    parts.append("Now write the environment.")
    return [{"role": "system", "content": DESIGNER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


# -- the no-corpus ablation as the paper's code ran it ---------------------------------------------

NO_CORPUS_PROMPTS = ("concepts", "corpus_without_document")

_PARTIAL_REWARDS = ("- give rewards in [0, 1]: small partial rewards for real progress are welcome, 1.0 only for "
                    "full success (which terminates the episode), 0.0 for a final failure; set `truncated=True` "
                    "when `max_turns` runs out;")
_BINARY_REWARD = ("- give a binary win/lose reward: 1.0 on the step where the agent wins (which terminates the "
                  "episode), 0.0 on every other step, and 0.0 with `terminated=True` when the agent has lost; no "
                  "partial rewards; set `truncated=True` when `max_turns` runs out;")
assert _PARTIAL_REWARDS in DESIGNER_SYSTEM
# The system prompt of the paper's no-corpus variant: the same contract, a binary reward.
CONCEPTS_DESIGNER_SYSTEM = DESIGNER_SYSTEM.replace(_PARTIAL_REWARDS, _BINARY_REWARD)

GAME_CONCEPTS = (
    "a hidden number, word or code that the agent narrows down from the feedback each guess earns",
    "a grid or maze explored one move at a time, with only the neighbourhood of the agent in view",
    "clues handed out on request that together fix one assignment (who owns what, which box holds what)",
    "a sequence or table whose generating rule the agent infers from the entries it asks for",
    "a budget or stock of resources spent over several decisions, each limiting the ones after it",
    "a small machine, circuit or lock whose hidden wiring the agent probes by trying inputs",
    "a system of variables where the agent intervenes, watches the effects and names the cause",
    "a state changed by a few allowed operations that must be brought to a target in few moves",
)


def concepts_designer_messages(request: DesignerRequest) -> list[Message]:
    """The designer prompt of the no-corpus ablation as the paper's code had it: no document,
    a list of example game concepts instead, and a binary win/lose reward
    (:data:`CONCEPTS_DESIGNER_SYSTEM`); skill, memory block and difficulty as in
    :func:`designer_messages`. ``request.document`` is ignored."""
    if request.difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {request.difficulty!r}: choose one of {', '.join(DIFFICULTIES)}")
    concepts = "\n".join(f"- {concept}" for concept in GAME_CONCEPTS)
    parts = [f"## Skill to train: {request.skill.name}\n{request.skill.description}",
             "## Example concepts\nKinds of games that suit this setting; start from one, combine "
             f"several, or invent your own that trains the skill:\n{concepts}"]
    if request.memory_block:
        parts.append(request.memory_block)
    parts.append(f"## Difficulty\n{DIFFICULTIES[request.difficulty]} Episodes end after at most "
                 f"{request.max_turns} turns, so a good game is won in roughly 4 to "
                 f"{max(4, request.max_turns - 2)} well-chosen actions.")
    parts.append("## Reward\nThe reward is binary: 1.0 when the agent wins, 0.0 otherwise.")
    parts.append("Now write the environment.")
    return [{"role": "system", "content": CONCEPTS_DESIGNER_SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)}]


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
