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


# -- tool use (SPEC 5, "Tool-use environments") ---------------------------------------------------

TOOL_APP_DOMAINS = ("retail orders", "travel booking", "telecom accounts", "banking", "calendar", "file system",
                    "shopping cart", "support tickets", "smart home", "project tracker")
# (name, weight, what the instructions must contain); drawn 3:2:1:1
TOOL_VARIANTS = (
    ("execute", 3, "Every instruction can be carried out directly with the tools."),
    ("read_then_write", 2, "At least one instruction needs a value the agent must first read with one tool "
                           "and then pass to another tool that changes the state."),
    ("missing_value", 1, "One instruction leaves out a value the tools need and that no tool can reveal; its "
                         "criterion is met only when the agent asks the user for it through a tool meant for "
                         "messaging the user, instead of guessing."),
    ("decline", 1, "One instruction asks for something none of the tools is for; the environment offers a "
                   "`decline_request` tool, and that instruction's criterion is met only when the agent calls it."),
)

TOOL_DESIGNER_SYSTEM = """You design simulated tool environments that train an assistant to use \
tools. Each environment is one Python module defining one class whose name ends in `Env` and that \
subclasses `ToolUseBaseEnv`. That base class is already defined where your code runs: do not \
import or redefine it. The assistant never sees your code, only the tools' schemas, the user's \
instructions and the tools' results.

In `reset(self, seed=None)` set, from `random.Random(seed)` only:
- `self._state`: a dict that is the hidden backend (records, balances, settings, ...);
- `self._tools`: 3 to 8 tools, name -> {"description": str, "parameters": a JSON Schema object \
with "type": "object", "properties" and "required"}; at least one parameter uses "enum" and at \
least one tool has a required parameter; include one or two plausible tools that the task does not need;
- `self._user_messages`: 3 to 5 instructions, given to the assistant one at a time;
- `self._message_criteria`: one function `state -> bool` per instruction;
- `self._current_msg = 0`, and return the first instruction.
Write each tool as a method `tool_<name>(self, **arguments) -> str` that reads or changes \
`self._state` and returns a short text result; bad arguments return an explanatory text.

Rules for the criteria: each is False on the freshly reset state, follows from its instruction \
alone (the assistant could tell when it is met), and can be made True with the tools offered. \
Instructions never state values the assistant is meant to look up. Use the standard library only, \
no clock, files or network. Reply with your reasoning, then the whole module in one ```python \
fenced block."""

TOOL_HINT_SYSTEM = """You write privileged hints for a tool-use task. You will read the full \
source of a simulated tool environment. Write a short step plan (at most six steps) naming which \
tools to call in which order and what to look for in their results, ending with the final reply \
<answer>done</answer>. Do not copy values that are drawn at reset. Reply with the plan only."""

TOOL_SCREEN_SYSTEM = """You review simulated tool environments. Read the source and the tool \
schemas, and decide whether every instruction's success criterion can be made true by some \
sequence of calls to the tools offered. Answer with one line: VERDICT: yes, or VERDICT: no."""


def draw_tool_variant(rng) -> tuple[str, str]:
    """One task variant, weighted 3:2:1:1: ``(name, requirement)``."""
    names = [v[0] for v in TOOL_VARIANTS]
    chosen = rng.choices(range(len(TOOL_VARIANTS)), weights=[v[1] for v in TOOL_VARIANTS])[0]
    return names[chosen], TOOL_VARIANTS[chosen][2]


def tool_designer_messages(request: DesignerRequest, app_domain: str, variant: tuple[str, str]) -> list[Message]:
    if request.difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {request.difficulty!r}: choose one of {', '.join(DIFFICULTIES)}")
    parts = [f"## Skill to train: {request.skill.name}\n{request.skill.description}",
             f"## Application domain\n{app_domain}",
             f"## Task variant: {variant[0]}\n{variant[1]}"]
    if request.document is not None:
        parts.append("## Source code document\nBorrow the data model, operations or edge cases of this code "
                     "for the backend and the tools. The task must make sense without reading it.\n\n"
                     f"<document>\n{request.document}\n</document>")
    if request.memory_block:
        parts.append(request.memory_block)
    parts.append(f"## Difficulty\n{DIFFICULTIES[request.difficulty]} The assistant has at most "
                 f"{request.max_turns} turns in all.")
    parts.append("Now write the environment.")
    return [{"role": "system", "content": TOOL_DESIGNER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def tool_hint_messages(source: str) -> list[Message]:
    return [{"role": "system", "content": TOOL_HINT_SYSTEM},
            {"role": "user", "content": f"```python\n{source}\n```\n\nWrite the step plan."}]


def screen_messages(source: str, tools_json: str) -> list[Message]:
    return [{"role": "system", "content": TOOL_SCREEN_SYSTEM},
            {"role": "user", "content": f"```python\n{source}\n```\n\nTools:\n{tools_json}\n\nVerdict?"}]


def parse_screen_verdict(text: str) -> bool | None:
    """True / False from the last ``VERDICT: yes|no`` line; None when there is none (no verdict)."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    verdict = None
    for line in text.splitlines():
        lowered = line.strip().lower()
        if lowered.startswith("verdict:"):
            word = lowered.split(":", 1)[1].strip().strip(".* ")
            verdict = True if word.startswith("yes") else False if word.startswith("no") else verdict
    return verdict
