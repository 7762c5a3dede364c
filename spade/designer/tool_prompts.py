"""What the Environment Designer is asked for tool-use environments (SPEC section 5), and the model
screen that reviews them, in this project's own words."""

from __future__ import annotations

from .prompts import DIFFICULTIES, DesignerRequest, Message


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
