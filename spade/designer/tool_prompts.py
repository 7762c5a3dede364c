"""What the Environment Designer is asked for tool-use environments (SPEC section 5), the hint it
writes for them and the model screen that reviews them, in this project's own words.

The structure follows the paper's tool-use prompt as the released code ran it (the multi-turn
template that the tool-use launchers select), section for section; ``docs/fidelity.md`` lists each
element with the released file and line. The fixed part (the class contract, the rules for
instructions and criteria, an example) is the system turn, so that every slot of a regeneration
shares it as one prefix; the user turn carries what changes per attempt, in the released order:
skill, difficulty, application domain, task variant, skill focus with example task shapes, the
corpus document as optional flavour, and the memory block last.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from .prompts import DesignerRequest, Message

TOOL_DIFFICULTIES = ("easy", "medium", "hard")


# -- application domains ---------------------------------------------------------------------------

@dataclass(frozen=True)
class AppDomain:
    """One of the ten application domains: its name and the objects and operations it is about."""

    name: str
    about: str


APP_DOMAINS: tuple[AppDomain, ...] = (
    AppDomain("retail orders", "orders, their items, refunds and shipping"),
    AppDomain("travel booking", "flights and hotels: searching, reserving, paying, cancelling"),
    AppDomain("telecom accounts", "plans, phone lines, bills and data add-ons"),
    AppDomain("banking", "accounts, transfers between them, cards, payments and invoices"),
    AppDomain("calendar", "events, invitations and reminders"),
    AppDomain("file system", "files and folders: moving, copying, searching"),
    AppDomain("shopping cart", "a catalogue, the cart, coupons and checkout"),
    AppDomain("support tickets", "tickets of a help desk: status, assignment and notes"),
    AppDomain("smart home", "devices such as lights, thermostat and locks, and scenes"),
    AppDomain("project tracker", "tasks, their assignees, status and due dates"),
)
TOOL_APP_DOMAINS: tuple[str, ...] = tuple(domain.name for domain in APP_DOMAINS)
_DOMAIN_ABOUT = {domain.name: domain.about for domain in APP_DOMAINS}


# -- task variants ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolVariant:
    """A task variant: its name, its weight in the draw, and what the instructions must contain."""

    name: str
    weight: int
    requirement: str


# drawn 3:2:1:1, as released (execute and read-then-write common, the other two rarer)
TOOL_VARIANTS: tuple[ToolVariant, ...] = (
    ToolVariant("execute", 3,
                "The plain case: the user gives short instructions and the agent carries out each one by calling "
                "the fitting tools in order. Every criterion checks the state those calls leave behind."),
    ToolVariant("read_then_write", 2,
                "At least one instruction makes the agent look at the state with a read tool first, pick out what "
                "meets a condition over what it read (say, every ticket still open after a week, or every "
                "account below its minimum balance), and only then make the writes that depend on it. That "
                "instruction's criterion checks the state after those condition-dependent writes, not only that "
                "some tool was called."),
    ToolVariant("missing_value", 1,
                "At least one instruction leaves out a value the write needs (say, 'refund my last purchase' "
                "without the order number, or 'pay the bill that is due' without its id). The agent has to find "
                "that value with a read tool before it writes. The write tool answers with an error when it gets "
                "a wrong or guessed value, so an invented argument can never meet the criterion."),
    ToolVariant("decline", 1,
                "Exactly one instruction asks for something that none of the domain's tools can do (say, a "
                "restaurant recommendation in a banking backend). Add a tool `decline_request` with one required "
                "string parameter `reason`; its method records the refusal in the state and ends like every other "
                "tool. That instruction's criterion holds only once `decline_request` was called, and no other "
                "tool may look able to serve the out-of-scope request."),
)


def draw_tool_variant(rng: random.Random) -> tuple[str, str]:
    """One task variant, weighted 3:2:1:1: ``(name, requirement)``."""
    chosen = rng.choices(TOOL_VARIANTS, weights=[v.weight for v in TOOL_VARIANTS])[0]
    return chosen.name, chosen.requirement


# -- what each skill looks like as a tool task -----------------------------------------------------

@dataclass(frozen=True)
class ToolSkillFocus:
    """The category a tool-use skill belongs to and four shapes of task that exercise it."""

    category: str
    example_tasks: tuple[str, str, str, str]


TOOL_SKILL_FOCUS: dict[str, ToolSkillFocus] = {
    "API Orchestration": ToolSkillFocus("stateful operations", (
        "open a folder, make a subfolder in it, move some files into the subfolder",
        "look up a balance, send money, look the balance up again",
        "search the stock, hold some items, confirm the hold, issue the invoice",
        "list the flights, book one, add the traveller's details, confirm the booking",
    )),
    "Data Retrieval": ToolSkillFocus("query, then act", (
        "list a folder, find the file wanted, read it, pull one figure out of it",
        "find a customer by name, fetch their orders, pick the latest one",
        "read the current settings, work out which are wrong, correct those",
        "query the records that match a condition, total them, report the total",
    )),
    "State Modification": ToolSkillFocus("chains of changes", (
        "create an account, give it permissions, add it to a group, check it is a member",
        "walk a folder tree, build a new layout of folders, move and rename the files",
        "bring a vehicle's systems up one by one (engine, doors, fuel), then drive it",
        "set up a portfolio: look at prices, place the orders, check the positions",
    )),
    "Error Recovery": ToolSkillFocus("robustness", (
        "move a file, get 'not found', search for its real path, move it again",
        "run an operation, get refused for lack of rights, raise the rights, run it again",
        "check whether a folder exists before making it, and cope with 'already exists'",
        "check the current state before a call that cannot be undone",
    )),
    "Tool Selection": ToolSkillFocus("decision making", (
        "see where you are first, then either move or act on the spot",
        "find out what kind an item is, then use the tool made for that kind",
        "read a file's format, then pick the converter that reads it",
        "check whether a record exists, then choose between creating and updating it",
    )),
    "Multi-Step Workflows": ToolSkillFocus("sequential planning", (
        "files: list, go into a folder, make a folder, move files, check, report",
        "an order: search the catalogue, check stock, reserve, pay, confirm, notify",
        "a device: check its status, configure it, switch it on, test it, check it, log it",
        "data: connect, query, filter, transform, write, check the output",
    )),
}


# -- the designer prompt ---------------------------------------------------------------------------

_EXAMPLE = '''```python
import random


class ParcelDeskEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        rng = random.Random(seed)
        owners = ["ana", "ben", "chen"]
        ids = [f"P{n}" for n in rng.sample(range(100, 1000), len(owners))]
        self._state = {"parcels": {i: {"owner": o, "where": "shelf"} for i, o in zip(ids, owners)},
                       "lockers": {"A1": None, "A2": None}, "looked_up": None, "texted": []}
        self._ben = ids[owners.index("ben")]
        self._tools = {
            "find_parcels": {"description": "Parcels waiting for one resident.", "parameters": {
                "type": "object", "properties": {"owner": {"type": "string"}}, "required": ["owner"]}},
            "to_locker": {"description": "Put a parcel from the shelf into an empty locker.", "parameters": {
                "type": "object", "properties": {"parcel_id": {"type": "string"},
                                                 "locker": {"type": "string", "enum": ["A1", "A2"]}},
                "required": ["parcel_id", "locker"]}},
            "text_resident": {"description": "Tell a resident that a parcel is ready.", "parameters": {
                "type": "object", "properties": {"owner": {"type": "string"}}, "required": ["owner"]}},
            "opening_hours": {"description": "When the desk is open.",
                              "parameters": {"type": "object", "properties": {}}},
        }
        self._user_messages = ["Is anything waiting for Ben?",
                               "Put his parcel into locker A2.",
                               "And let him know it is there."]
        self._message_criteria = [lambda s: s["looked_up"] == "ben",
                                  lambda s: s["lockers"]["A2"] == self._ben,
                                  lambda s: "ben" in s["texted"]]
        self._current_msg = 0
        self._expected_answer = "done"
        return self._user_messages[0], {}

    def tool_find_parcels(self, owner):
        owner = owner.strip().lower()
        self._state["looked_up"] = owner
        found = [i for i, p in self._state["parcels"].items() if p["owner"] == owner and p["where"] == "shelf"]
        return f"waiting for {owner}: {found}" + self._advance_if_done()

    def tool_to_locker(self, parcel_id, locker):
        parcel = self._state["parcels"].get(parcel_id)
        if parcel is None or parcel["where"] != "shelf":
            return f"Error: no parcel {parcel_id} on the shelf" + self._advance_if_done()
        if locker not in self._state["lockers"] or self._state["lockers"][locker] is not None:
            return f"Error: locker {locker} is not free" + self._advance_if_done()
        parcel["where"], self._state["lockers"][locker] = locker, parcel_id
        return f"{parcel_id} is in {locker}" + self._advance_if_done()

    def tool_text_resident(self, owner):
        owner = owner.strip().lower()
        self._state["texted"].append(owner)
        return f"texted {owner}" + self._advance_if_done()

    def tool_opening_hours(self):
        return "8:00-18:00" + self._advance_if_done()

    def solution(self):
        return (f"1. find_parcels(owner='ben') 2. to_locker(parcel_id='{self._ben}', locker='A2') "
                "3. text_resident(owner='ben') 4. <answer>done</answer>")
```'''

TOOL_DESIGNER_SYSTEM = f"""You design simulated tool environments for training an assistant to \
use tools over several turns. An environment is one Python module with one class whose name ends \
in `Env` and that subclasses `ToolUseBaseEnv`. That base class is already defined where your code \
runs: do not import it and do not define it again. The assistant never sees your code; it sees the \
tools' schemas, the user's instructions and the text the tools return.

## How an episode goes
Like a real user, the environment gives its instructions one at a time, each short, and the \
next one only after the current one is done; it never lays out the whole job in advance. The assistant calls \
tools; once the current instruction's criterion holds, the result of that call ends with \
`[STEP n COMPLETE — NEW INSTRUCTION] <the next instruction>`, and after the last one with \
`[ALL STEPS COMPLETE] Submit <answer>done</answer>.` The episode is won when the assistant then \
replies <answer>done</answer>.

## What you write
- `reset(self, seed=None)`: draw every random choice from `random.Random(seed)` and set
  - `self._state`: a dict, the hidden backend (records, balances, settings, ...);
  - `self._tools`: tool name -> {{"description": str, "parameters": a JSON Schema object with \
"type": "object", "properties" and "required"}};
  - `self._user_messages`: 3 to 5 instructions;
  - `self._message_criteria`: one function `state -> bool` per instruction, reading the dict \
passed in (it is `self._state`);
  - `self._current_msg = 0` and `self._expected_answer = "done"`;
  and return `(self._user_messages[0], {{}})`.
- One method `tool_<name>(self, ...) -> str` per tool, its parameter names exactly the names under \
"properties" in that tool's schema. It reads or changes `self._state` and returns a short text; \
called with bad arguments or before its preconditions hold it returns an error text instead of \
raising. Every tool method ends with `return <its text> + self._advance_if_done()`.
- `solution(self) -> str`: the correct sequence of tool calls with their arguments for the \
current reset, then the final <answer>done</answer>. It must not raise.

The base class already provides `_advance_if_done()` (it moves on when the current criterion holds \
and returns the notice above, or "" when nothing changed), `_check_answer()` (it accepts `done` \
only after every instruction is complete), `get_tools()`, the parsing of tool calls, format \
errors and the turn count. Do not write `step()` and do not parse tool calls yourself.

## Instructions
- Each is one short goal (one or two sentences) in plain words. Never name a tool, a state key or \
any other detail of the implementation in an instruction.
- Each can be checked on `self._state` alone, and completing it should take 4 to 8 tool calls.
- A later instruction stays hidden until the current one is met, so it cannot be done early.

## Criteria: the most common way an environment is broken
1. Not met for free. A criterion is False on the state that reset returns and only turns True \
when the assistant does what its instruction asks. For a write, check the change it makes. For an \
instruction that only reads or verifies something, let the read tool record in the state that it \
ran and check that record; a fact that is already true at reset would complete the step on any call.
2. Same shape. A criterion reads the state in the same shape the tools write it: a string is never \
`in` a list of dicts, and 5 never equals "5".
3. Derivable. Every value a criterion needs is stated in its instruction or returned by some tool: \
never an id, date, amount or threshold that the assistant could only guess. Either state it, or \
accept any valid change, or let a tool reveal it.
4. Every needed tool can succeed. If a tool looks a record up by some key, reset or an earlier \
tool must store that key.
5. An instruction says exactly what its criterion checks: nothing more, nothing less.
6. Trace before you answer: run reset(seed=0) in your head and follow your solution(). After each \
step the matching criterion turns True, in order, and no later one is True early; at the end every \
instruction is complete and `done` is accepted. Fix anything that fails.

## Other rules
- Standard library only (random, json, re, math, ...); no network, files, subprocesses or clock.
- Tools are deterministic: all randomness happens in reset.
- 3 to 8 tools. At least one parameter uses "enum" and at least one tool has a "required" \
parameter. Include 1 or 2 distractor tools that are plausible but not what the task needs, and do \
not label them as such.
- Tools that change the state refuse politely when their preconditions do not hold (an error \
text such as "no such folder"), so the assistant has to look before it acts.

## Example
An environment of this shape (yours will be about something else):
{_EXAMPLE}

Reply with your reasoning, then the whole module in one ```python fenced block."""


def _skill_focus(skill_name: str) -> str | None:
    focus = TOOL_SKILL_FOCUS.get(skill_name)
    if focus is None:
        return None
    examples = "\n".join(f"- {task}" for task in focus.example_tasks)
    return f"## Skill focus: {focus.category}\nExample tasks (take one or make up your own):\n{examples}"


def tool_designer_messages(request: DesignerRequest, app_domain: str, variant: tuple[str, str]) -> list[Message]:
    """The tool designer prompt for one attempt: the system turn is the fixed contract
    (:data:`TOOL_DESIGNER_SYSTEM`); the user turn is this attempt's skill, difficulty, domain,
    variant, skill focus, document and memory block, in the released order."""
    if request.difficulty not in TOOL_DIFFICULTIES:
        raise ValueError(f"difficulty {request.difficulty!r}: choose one of {', '.join(TOOL_DIFFICULTIES)}")
    about = _DOMAIN_ABOUT.get(app_domain)
    domain_text = app_domain if about is None else f"{app_domain}\nIt is about {about}."
    parts = [f"## Skill to train: {request.skill.name}\n{request.skill.description}",
             f"## Difficulty\n{request.difficulty}",
             f"## Application domain\n{domain_text} Build the state, the tools and the user's goal for this "
             "domain: a realistic user getting something done (searching, booking, ordering, updating, "
             "cancelling, transferring, scheduling), not an exam or a quiz about any document.",
             f"## Task variant: {variant[0]}\n{variant[1]}"]
    focus = _skill_focus(request.skill.name)
    if focus is not None:
        parts.append(focus)
    if request.document is not None:
        parts.append("## Source code document (optional flavour)\nYou may take names, numbers or entities from "
                     "this excerpt for the data, but the application domain above stays as it is: the task is "
                     "not about the excerpt, and the instructions never refer to it.\n\n"
                     f"<document>\n{request.document}\n</document>")
    parts.append("Now write the environment.")
    if request.memory_block:
        parts.append(request.memory_block)
    return [{"role": "system", "content": TOOL_DESIGNER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


# -- the hint --------------------------------------------------------------------------------------

TOOL_HINT_SYSTEM = """You write a strategy hint for an assistant that is about to work through a \
multi-turn tool environment. You will read the environment's full source, which the assistant \
cannot see. It gets one user instruction at a time, calls tools, reads their results, and must \
reply <answer>done</answer> only after every instruction is complete. Your hint is added to its \
first observation.

The hint is a rough plan that helps a stuck assistant but leaves the task to it; it never gives \
the answer. Looking up the concrete values through the tools is what the assistant is learning, \
and a hint it could win with by copying teaches it nothing.

Write 2 or 3 sentences, under 100 words, specific to this environment but free of values:
- describe the phases of the work in terms of tool roles (for example: find the account in \
question, then change it, then confirm the change), and which tools are distractors or out of \
scope; not a filled-in sequence of calls;
- tell the assistant to take one instruction at a time, to get the exact arguments from tool \
results and the instructions instead of assuming them, and to reply <answer>done</answer> only \
when all instructions are done;
- if an instruction leaves out a value a call needs, tell it to find the value with a lookup tool \
rather than guess; if a request is outside what the tools do, tell it to decline.

Never write a concrete value from the code or the state (an id, name, file name, path, amount, \
date or status string): use placeholders such as <order_id> or phrases such as "the order the \
user names". Never mention state variables or the criteria's code. Reply with the hint text only."""


def tool_hint_messages(source: str) -> list[Message]:
    return [{"role": "system", "content": TOOL_HINT_SYSTEM},
            {"role": "user", "content": f"The environment's source:\n```python\n{source}\n```"}]


# -- the model screen ------------------------------------------------------------------------------

TOOL_SCREEN_SYSTEM = """You audit generated multi-turn tool environments for solvability. Reject \
an environment only when no sequence of tool calls can meet its success criteria; keep one that \
is merely hard, where the assistant has to discover hidden values by calling tools. A hard \
environment is useful training; an impossible one is useless. Follow every criterion back to the tool that can \
make it true."""

_SCREEN_CHECKS = """Check it criterion by criterion.

1. List the success criteria (the functions in `_message_criteria`, and any `_advance_if_done`, \
`_check_answer` or termination logic) and the exact state each one needs.
2. For each needed state value, find the tool that writes it. If every criterion's state is \
written by some tool, the environment is solvable, however hard. If some criterion needs a value \
that no tool ever writes, or two criteria contradict each other, it is impossible: reject.
   Random values are fine when some tool returns them to the assistant, whether drawn at reset or \
inside a tool: the assistant reads the value and uses it. Reject for randomness only if a needed \
value never appears in any tool result, or a tool gives a different value on every call with the \
same input.
3. Also reject for any of these:
   - a type mismatch: the criterion compares state in a shape the tools never write (a string \
tested for membership in a list of dicts, the number 5 against the string "5");
   - a needed state written only by a tool that can never succeed (it looks up a key that nothing \
stores);
   - an underivable value: the criterion needs an exact id, date, amount or threshold that no \
instruction states and no tool returns, so the assistant could only guess;
   - pre-satisfied steps: criteria already true on the state reset builds complete on the first \
call without the work. Reject only when the majority of the steps are like this; one such step in \
an otherwise sound environment is kept.
4. Do not reject for difficulty: hidden values found through lookup tools, long strict sequences, \
distractor or out-of-scope tools and instructions that need careful reading are all good.
5. Ignore cosmetic issues (wording of messages, formatting, harmless edge cases).

Answer \\boxed{no} if some criterion is impossible or unwinnable by these checks, else \\boxed{yes}."""


def screen_messages(source: str, tools_json: str | None = None) -> list[Message]:
    """The screen call: the source (and, when given, the tool schemas at reset) followed by the
    checks and the verdict format, as the released validator's user turn."""
    tools = "" if tools_json is None else f"\n\nTools:\n{tools_json}"
    return [{"role": "system", "content": TOOL_SCREEN_SYSTEM},
            {"role": "user", "content": "Audit this multi-turn tool environment for solvability. The assistant "
                                        "calls tools turn by turn and replies <answer>done</answer> once every "
                                        "step is met; it is solvable when some sequence of tool calls makes every "
                                        f"criterion true.\n\n```python\n{source}\n```{tools}\n\n{_SCREEN_CHECKS}"}]


def parse_screen_verdict(text: str) -> bool | None:
    """The screen's verdict after any reasoning block: the last ``\\boxed{...}`` (yes / y / true
    accept, any other word rejects, as released) or, failing that, the last ``VERDICT: yes|no``
    line; None when there is neither (no verdict, which admission counts as accept)."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return None  # the reasoning never ended
    boxed = _last_boxed(text)
    if boxed is not None:
        word = re.sub(r"^\\text\w*\{(.*)\}$", r"\1", boxed.strip())  # \boxed{\text{yes}}
        return word.strip().strip(".*").strip().lower() in ("yes", "y", "true")
    verdict = None
    for line in text.splitlines():
        lowered = line.strip().lower()
        if lowered.startswith("verdict:"):
            word = lowered.split(":", 1)[1].strip().strip(".* ")
            verdict = True if word.startswith("yes") else False if word.startswith("no") else verdict
    return verdict


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 1, start + len("\\boxed{")
    for index in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[begin:index]
    return None
