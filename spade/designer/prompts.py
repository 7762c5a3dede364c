"""What the Environment Designer is asked (SPEC section 5), in this project's own words.

Two calls per environment: the **designer** call writes a complete environment class grounded in
one corpus document, for one skill, informed by the memory block; the **hint** call reads the
finished source and writes a short privileged hint for the hinted arm of the agent.

The games designer prompt has the layout of the paper's released code
(``spade/core/prompts/corpus_template.py`` and the memory step of ``core/orchestrator.py``): a
short system message naming the role, then one user message holding, in this order,

1. the reference document (the corpus on),
2. the game specification (:data:`GAME_SPEC`: how the agent acts, the multi-turn demands, the
   class contract with ``solution()`` and ``close()``, the reliability rules),
3. the skill and the difficulty line ("the goal should need 3+ interaction steps"),
4. the memory block (:func:`spade.designer.memory.format_memory_block`), last.

Only the system message is common to every slot of a regeneration; the document opens the user
message, so the engines' prefix caches (SGLang's radix cache, the hf engine's shared prefix) share
little beyond it. The content order is the paper's; the cache pays for it.

The no-corpus ablation (``selfplay.no_corpus_prompt: concepts``, :func:`concepts_designer_messages`)
follows the released code's plain multi-turn prompt: three concepts drawn from four written for the
skill, the run's turn budget as the class's default and pacing, a binary win/lose reward.

Which rules the contract states is ``selfplay.designer_prompt_rules`` (:data:`DESIGNER_RULES`):
``spade`` (the default) adds to the released items an explicit ban on observations that state the
answer or a formula that gives it away, ``random.Random(seed)`` as the only source of chance, no
``input()``/clock/files/network, JSON-serialisable info, a bad command using up its turn, and a
reward in [0, 1] on every step; ``released`` states the released items only, in our words
(``corpus_template.py:18-96`` with the corpus; ``template.py:444-619`` for the concepts prompt).
The paper reports the share of environments whose first observation states the governing formula
falling during training (SPEC 6): a prompt that forbids it from step 0 changes that measurement.

The hint prompt's length is ``selfplay.hint_length`` (:data:`HINT_LENGTHS`): ``four_sentences``
(the default) or ``three_sentences`` (the released "1-3 sentences (under 100 words)",
``core/hint_generator.py:37``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .skills import Skill

Message = dict[str, str]

# The role only: the same for every designer call, so it stays a shared prefix.
DESIGNER_SYSTEM = ("You are a Python programmer who designs interactive, multi-turn text games: environments in "
                   "which a player makes a sequence of decisions and every action changes the state of the game.")

HINT_LENGTHS: dict[str, str] = {"four_sentences": "at most four sentences",
                                "three_sentences": "one to three sentences, fewer than 100 words"}
_HINT_SYSTEM = """You write privileged hints for interactive text games. You will read the full \
source of a game. Write a short hint ({length}) that would help a capable player: \
the key insight, a good plan, and the exact answer format the game accepts. Never state the \
secret answer itself, any value that is only known after reset, or anything that makes playing \
unnecessary. Reply with the hint only."""
HINT_SYSTEM = _HINT_SYSTEM.format(length=HINT_LENGTHS["four_sentences"])


@dataclass(frozen=True)
class DesignerRequest:
    """Everything one designer attempt is conditioned on."""

    skill: Skill
    document: str | None  # None in the no-corpus ablation
    memory_block: str = ""  # "" when memory is empty or disabled
    difficulty: str = "medium"
    max_turns: int = 25  # the run's turn budget (selfplay.max_turns); the concepts prompt quotes it
    reference_policy: bool = False  # ask for a reference_policy() method (selfplay.admission.reference_policy)
    rules: str = "spade"  # selfplay.designer_prompt_rules: "spade" or "released" (DESIGNER_RULES)


# The released code's difficulty line: "the goal should need N+ interaction steps", 2 for easy and
# 3 otherwise (corpus_template.py); no win-rate targets.
DIFFICULTY_STEPS = {"easy": 2, "medium": 3, "hard": 3}
DIFFICULTIES = {name: f"the goal should need {steps}+ interaction steps" for name, steps in DIFFICULTY_STEPS.items()}

# The class's own turn default in the specification's example (the released example's 12); the
# run's selfplay.max_turns only caps it (spade.envs.runner.turn_budget).
EXAMPLE_MAX_TURNS = 12

_BOXED = "\\boxed{<action>}"

_ACTING = f"""## How the agent acts
- Every turn the agent sends exactly one action wrapped as {_BOXED}, for example \\boxed{{weigh coins 3 and 5}}, \
\\boxed{{go east}} or \\boxed{{close valve B}}. `step()` receives that text; take the command out of the box \
(for instance with `re.search(r"\\\\boxed\\{{(.+?)\\}}", action)`, using the whole text when there is no box).
- The boxed text is a command that changes the environment: a move, a measurement, a query, an \
operation. It is not a final answer to be graded once. `step()` applies it, updates the state and \
returns a new observation that shows what changed."""

_MULTI_TURN_PARTIAL = """## What makes it multi-turn (all required)
- No single action reaches the goal. It takes a sequence: probe to uncover hidden information and \
then act on it, or move the state toward a target one step at a time.
- Hidden state: `reset()` does not show everything. The agent learns more by acting, and the \
observations change as it does.
- Partial rewards: each step's reward lies in [0, 1]; progress toward the goal earns a partial \
reward below 1.0, and 1.0 is paid only for full success. `terminated=True` only when the goal is \
reached; when the turns run out, `truncated=True`.
- Every observation shows the updated state and reminds the agent of the reply format, e.g. \
"Reply with your next action as \\boxed{<action>}."
"""

_MULTI_TURN_BINARY = """## What makes it multi-turn (all required)
- No single action reaches the goal. It takes a sequence: probe to uncover hidden information and \
then act on it, or move the state toward a target one step at a time.
- Hidden state: `reset()` does not show everything. The agent learns more by acting, and the \
observations change as it does.
- Binary reward: 1.0 with `terminated=True` on the step that wins, 0.0 with `terminated=True` when \
the agent has lost, 0.0 on every other step; no partial rewards. When the turns run out, \
`truncated=True` with reward 0.0.
- Every observation shows the current state, the result of the last action, the available actions \
and the progress (e.g. "Turn 3/12"), and reminds the agent of the reply format.
"""

_AVOID = """## Do not
- read one boxed answer, grade it and end the episode: the box carries a command for this turn;
- state the whole problem in `reset()` and then only check a submitted value;
- repeat the same fixed task every turn with nothing but "wrong, try again" as feedback."""

_GROUNDING = """## Grounding
Playing must call for a concept or technique from the document: if it describes an algorithm, the \
agent carries the algorithm out step by step; if it describes a system, the agent operates that \
system over several turns. The game text never mentions the document (no "as the passage says"): \
it stands on its own."""


def _interface(default_turns: int, reward_rule: str, with_solution: bool) -> str:
    solution = ('''
    def solution(self):
        # a sequence of actions (or a description of the goal state) that solves this episode
        ...
''' if with_solution else "")
    return f'''## Interface
Use these names and signatures (the class name must end in `Env`); fill in the bodies.
```python
import random
import re


class DescriptiveNameEnv:
    def __init__(self, max_turns={default_turns}, **kwargs):
        self.max_turns = max_turns
        # create every attribute the game uses here, before reset()
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.turn_count = 0
        # hidden state and a goal that takes several actions, drawn from self.rng
        # observation: rules, starting state, available actions, how to reply with \\boxed{{<action>}};
        # never the solution
        return observation, {{}}

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\\\boxed\\{{(.+?)\\}}", action)
        command = (found.group(1) if found else action).strip()
        # parse the command, update the state, describe the new state
        # {reward_rule}
        truncated = self.turn_count >= self.max_turns
        return observation, reward, terminated, truncated, {{}}
{solution}
    def close(self):
        pass
```'''


_RULES = """## Rules that keep it loadable
- Python standard library only, and import everything you use; no `input()`, no clock, files or network.
- Every random choice comes from `random.Random(seed)` created in `reset()`: the same seed gives the same game.
- In f-strings and `.format()` a literal brace is doubled: inside an f-string write \\boxed{{<action>}} \
to show \\boxed{<action>}.
- Every path through `step()` returns the 5-tuple (str, float, bool, bool, dict); the info dict \
holds only JSON-serialisable values.
- An unknown or malformed command never raises: it gets an observation that explains the problem \
and reward 0.0, and it uses up the turn.
- Never divide by a value that can be zero. Keep answers in attributes such as `self._solution`, \
never `self.solution`, which would hide the method.
- Observations never state the answer or a formula that gives it away; the answer can be worked \
out from the interaction alone."""

_SELF_CHECK = """## Check before you answer
- Trace two different action sequences from `reset(seed=0)`: do the observations differ? If they \
never change, the game is not interactive: fix it.
- Does the box carry a command that changes the state, not a final answer that ends the game?"""

_SELF_CHECK_PARTIAL = _SELF_CHECK + "\n- Are the rewards partial for progress and always within [0, 1]?"
_SELF_CHECK_BINARY = _SELF_CHECK + "\n- Is the reward 1.0 only on the winning step and 0.0 everywhere else?"

_PARTIAL_RULE = "reward: partial progress in [0, 1], 1.0 for full success; terminated only when the goal is reached"
_BINARY_RULE = "reward: 1.0 on the winning step, 0.0 otherwise; terminated on a win or a loss"

# The contract of a corpus-grounded game, after the document (grounding included) ...
GAME_SPEC = "\n\n".join((_ACTING, _MULTI_TURN_PARTIAL.rstrip(), _AVOID, _GROUNDING,
                         _interface(EXAMPLE_MAX_TURNS, _PARTIAL_RULE, with_solution=True), _RULES, _SELF_CHECK_PARTIAL))
# ... and without a document to ground it (no_corpus_prompt: corpus_without_document).
GAME_SPEC_NO_DOCUMENT = GAME_SPEC.replace("\n\n" + _GROUNDING, "")

_CLOSING = "Write the complete module in one ```python block."

# selfplay.admission.reference_policy (spade's addition, issue 23; off in the paper recipes): the class
# proves its game winnable; admission plays the method and admits only when it wins.
REFERENCE_POLICY_SPEC = """## Reference policy (required)
Add a method `reference_policy(self, observation)` to the class. Given the latest observation (the \
one `reset()` returned, then each one `step()` returned), it returns the reply a perfect player \
would send, as a string such as "\\boxed{go east}". It may read the hidden state of the instance. \
Before admission the game is played with these replies on several seeds: they must win (full \
reward at the end) every time. Keep it short and deterministic, and never let `step()` behave \
differently because the reference policy exists."""


# -- selfplay.designer_prompt_rules: released (the released items only, in our words) ----------------

DESIGNER_RULES = ("spade", "released")

# corpus_template.py:29-36: partial reward, terminated at the goal, the state and the reply format shown
_MULTI_TURN_RELEASED = """## What makes it multi-turn (all required)
- No single action reaches the goal. It takes a sequence: probe to uncover hidden information and \
then act on it, or move the state toward a target one step at a time.
- Hidden state: `reset()` does not show everything. The agent learns more by acting, and the \
observations change as it does.
- Partial reward for progress toward the goal; `terminated=True` only when the goal is reached.
- Every observation shows the updated state and reminds the agent to reply with its next action \
as \\boxed{<action>}."""

# corpus_template.py:79-89: the reward scale and the robustness list, nothing else
_RULES_RELEASED = """## Rules that keep it loadable
- Reward scale: the total reward stays within [0, 1]; progress earns less than 1.0, full success 1.0.
- In f-strings and `.format()` a literal brace is doubled: inside an f-string write \\boxed{{<action>}} \
to show \\boxed{<action>}.
- Create every attribute in `__init__` before it calls `reset()`.
- Python standard library only (`math`, `random` and the like); import everything you use and never \
call a name you did not import (no bare `integrate`, no `np.`; write `math.cos(x)`).
- Every path through `step()` returns the 5-tuple (str, float, bool, bool, dict); info is always a dict.
- An unknown or garbled command never crashes: it gets a helpful observation and reward 0.0.
- Never divide by a value that can be zero. Keep answers in attributes such as `self._solution`, \
never `self.solution`, which would hide the method."""

# template.py:604-615: the no-corpus prompt's robustness list
_RULES_RELEASED_CONCEPTS = """## Rules that keep it loadable
- Never call `input()`: the `action` argument of `step()` is the player's whole reply.
- Never divide by a value that can be zero.
- Create every attribute in `__init__` before it calls `reset()`.
- Info is always a dict (`{}`), never a string.
- Every path through `step()` returns the 5-tuple (str, float, bool, bool, dict).
- Unexpected input never crashes the game: show the valid actions instead.
- Python standard library only (`random`, `re`, `collections` and the like).
- In f-strings a literal brace is doubled: `{{ }}`.
- No backslash inside an f-string expression: put the text in a variable first \
(`sep = '\\n'` and then `f'{sep.join(items)}'`), or call `'\\n'.join(items)` outside the f-string."""


def _interface_released(default_turns: int, reward_rule: str, with_solution: bool) -> str:
    """The interface sketch with the released comments: chance 'by the seed', no rng named."""
    return (_interface(default_turns, reward_rule, with_solution)
            .replace("        self.rng = random.Random(seed)\n", "")
            .replace("drawn from self.rng", "randomised by the seed"))


def _spec(request: DesignerRequest, document: bool) -> str:
    """The corpus prompt's specification for ``request.rules`` (with or without grounding)."""
    if request.rules == "released":
        sections = [_ACTING, _MULTI_TURN_RELEASED, _AVOID] + ([_GROUNDING] if document else []) + [
            _interface_released(EXAMPLE_MAX_TURNS, _PARTIAL_RULE, with_solution=True), _RULES_RELEASED,
            _SELF_CHECK_PARTIAL]
        return _game_spec(request, "\n\n".join(sections))
    return _game_spec(request, GAME_SPEC if document else GAME_SPEC_NO_DOCUMENT)


def _game_spec(request: DesignerRequest, spec: str) -> str:
    """The specification, with the reference-policy section when the request asks for one."""
    return f"{spec}\n\n{REFERENCE_POLICY_SPEC}" if request.reference_policy else spec


def _check_difficulty(difficulty: str) -> None:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {difficulty!r}: choose one of {', '.join(DIFFICULTIES)}")


def _check_rules(rules: str) -> None:
    if rules not in DESIGNER_RULES:
        raise ValueError(f"selfplay.designer_prompt_rules: {rules!r} is not allowed; choose one of: "
                         f"{', '.join(DESIGNER_RULES)}")


def difficulty_line(request: DesignerRequest) -> str:
    stop = "" if request.skill.description.endswith(".") else "."  # the released one-liners have no full stop
    return f"Skill to train: {request.skill.name} ({request.skill.description}){stop} Difficulty: " \
           f"{request.difficulty}: {DIFFICULTIES[request.difficulty]}."


def _with_memory(parts: list[str], request: DesignerRequest, after: tuple[str, ...] = ()) -> list[Message]:
    """The designer messages: ``parts``, then the memory block (when there is one), then ``after``."""
    if request.memory_block:
        parts.append(request.memory_block)
    parts.extend(after)
    return [{"role": "system", "content": DESIGNER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


# ``selfplay.designer_prompt_order``: "released" is the paper's code (document, specification, skill and
# difficulty, memory last); "shared_prefix" is this project's variant with the same sections, the
# document moved last, so the prompts of one regeneration share everything before it (the engines'
# prefix caches compute it once: README, Performance) and a small model reads the closing request last.
PROMPT_ORDERS = ("released", "shared_prefix")


def designer_messages(request: DesignerRequest, *, no_corpus: str | None = None,
                      rng: random.Random | None = None, order: str = "released") -> list[Message]:
    """The games designer prompt. ``no_corpus`` is None with the corpus on; in the no-corpus
    ablation it names the prompt (``selfplay.no_corpus_prompt``): ``"concepts"`` (the paper's
    code, :func:`concepts_designer_messages`, which draws its concepts with ``rng``) or
    ``"corpus_without_document"`` (this prompt with no document section). ``order``: see
    :data:`PROMPT_ORDERS` (only the prompt with a document has a choice)."""
    if no_corpus is not None and no_corpus not in NO_CORPUS_PROMPTS:
        raise ValueError(f"selfplay.no_corpus_prompt: {no_corpus!r} is not allowed; choose one of: "
                         f"{', '.join(NO_CORPUS_PROMPTS)}")
    _check_rules(request.rules)
    if no_corpus == "concepts":
        return concepts_designer_messages(request, rng if rng is not None else random.Random(0))
    _check_difficulty(request.difficulty)
    if order not in PROMPT_ORDERS:
        raise ValueError(f"selfplay.designer_prompt_order: {order!r} is not allowed; choose one of: "
                         f"{', '.join(PROMPT_ORDERS)}")
    if request.document is None:
        parts = ["Build an interactive, multi-turn Python game environment.",
                 _spec(request, document=False)]
    elif order == "shared_prefix":
        # the same sections, the document moved behind everything one regeneration's slots share
        parts = ["You are given a reference document (at the end). Build an interactive, multi-turn Python game "
                 "environment around a concept or technique from it.", _spec(request, document=True),
                 difficulty_line(request)]
        return _with_memory(parts, request, after=(f"<document>\n{request.document}\n</document>", _CLOSING))
    else:
        parts = ["You are given a reference document. Build an interactive, multi-turn Python game environment "
                 "around a concept or technique from it.\n\n"
                 f"<document>\n{request.document}\n</document>", _spec(request, document=True)]
    parts.append(f"{difficulty_line(request)}\n\n{_CLOSING}")
    return _with_memory(parts, request)


# -- the no-corpus ablation as the paper's code ran it ---------------------------------------------

NO_CORPUS_PROMPTS = ("concepts", "corpus_without_document")
CONCEPTS_SHOWN = 3  # drawn from the skill's four (the released prompt samples 3)

# Four game ideas per game skill, in this project's words (the released code keeps four per skill).
SKILL_CONCEPTS: dict[str, tuple[str, ...]] = {
    "Mathematical Reasoning": (
        "a ledger of hidden item values: buy and sell across rounds to reach a target sum within a budget",
        "a path through a grid of arithmetic operations, chosen cell by cell, that must end on a target number",
        "a set of scales: load weights in turns to find the hidden mass of each object",
        "a network of pipes whose flow rates combine: open and close sections until the outlet hits a set rate",
    ),
    "Logical Deduction": (
        "an investigation: question witnesses, search rooms and examine evidence before naming the culprit",
        "a locked-room puzzle in which each object examined yields a clue needed for the next",
        "a grid of who-owns-what that the agent fills by asking yes/no questions about single cells",
        "a hidden code guessed over several rounds, each guess scored by how many symbols sit in the right place",
    ),
    "Spatial Reasoning": (
        "a maze seen only around the agent, with dead ends and a limited supply of moves",
        "a warehouse where crates are pushed one square at a time onto marked spots",
        "a floor plan whose furniture must be placed to satisfy adjacency and clearance rules",
        "a rover steered around obstacles on a map it uncovers as it drives, with limited fuel",
    ),
    "Pattern Recognition": (
        "a hidden colour sequence deduced from feedback on each trial sequence",
        "a map whose locations each reveal one letter of a substitution cipher; decode the final message",
        "a minefield of small size: uncover cells and use the neighbour counts to find the safe ones",
        "rooms holding fragments of a repeating motif: collect enough to predict the missing pieces",
    ),
    "Optimization": (
        "items offered one at a time, each taken or passed, to maximise value under a weight limit",
        "jobs assigned to machines turn by turn so that everything finishes as early as possible",
        "a production line reconfigured each round to maximise output before a deadline",
        "a budget spread over investments round by round while hidden returns shift",
    ),
    "Causal Inference": (
        "an experiment bench: choose which variable to change each turn and name the hidden causal rule",
        "a faulty machine diagnosed by testing its components in an order the agent picks",
        "an outbreak: apply interventions, watch the case counts and find where it started",
        "a circuit of switches and lamps: toggle inputs, read the outputs, find the broken gate",
    ),
}

# For a skill without its own list (a custom skill list): ideas that suit any skill.
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


def skill_concepts(skill: Skill, rng: random.Random) -> list[str]:
    """The concepts one no-corpus prompt shows: ``CONCEPTS_SHOWN`` drawn with ``rng`` from the
    skill's own list (:data:`SKILL_CONCEPTS`), or from :data:`GAME_CONCEPTS` for another skill."""
    pool = SKILL_CONCEPTS.get(skill.name, GAME_CONCEPTS)
    return rng.sample(pool, min(CONCEPTS_SHOWN, len(pool)))


def concepts_spec(max_turns: int, rules: str = "spade") -> str:
    """The no-corpus game specification: binary reward, no solution() method, the run's turn
    budget as the class's default, and the pacing the released prompt asks for; ``rules``
    ``released`` states the released prompt's robustness list instead of :data:`_RULES`."""
    pacing = (f"## Pacing\nThe game is played for at most {max_turns} turns: set budgets and difficulty to match. "
              f"Good play should win in roughly {max_turns // 2} to {max_turns * 3 // 4} turns, and random play "
              "should usually lose. The game has a clear way to win and, ideally, a way to lose.")
    if rules == "released":
        interface, checked = _interface_released(max_turns, _BINARY_RULE, with_solution=False), _RULES_RELEASED_CONCEPTS
    else:
        interface, checked = _interface(max_turns, _BINARY_RULE, with_solution=False), _RULES
    return "\n\n".join((_ACTING, _MULTI_TURN_BINARY.rstrip(), _AVOID, pacing, interface, checked, _SELF_CHECK_BINARY))


def concepts_designer_messages(request: DesignerRequest, rng: random.Random) -> list[Message]:
    """The designer prompt of the no-corpus ablation as the paper's code had it: no document, a
    few concepts for the skill (drawn with ``rng``), a binary win/lose reward, no difficulty line
    (the released prompt has none), the memory block last. ``request.document`` is ignored."""
    _check_difficulty(request.difficulty)
    _check_rules(request.rules)
    concepts = "\n".join(f"- {concept}" for concept in skill_concepts(request.skill, rng))
    parts = [f"Build an interactive, multi-turn text game as a Python class that trains {request.skill.name} "
             f"({request.skill.description})",
             f"## Concept ideas for {request.skill.name}\nStart from one of these or invent a similar one:\n"
             f"{concepts}",
             _game_spec(request, concepts_spec(request.max_turns, request.rules)),
             f"{_CLOSING} Each turn must offer choices that lead to different outcomes: a game with only one "
             "sensible action per turn does not qualify."]
    return _with_memory(parts, request)


def hint_messages(source: str, length: str = "four_sentences") -> list[Message]:
    """The games hint call; ``length`` is ``selfplay.hint_length`` (:data:`HINT_LENGTHS`)."""
    if length not in HINT_LENGTHS:
        raise ValueError(f"selfplay.hint_length: {length!r} is not allowed; choose one of: {', '.join(HINT_LENGTHS)}")
    return [{"role": "system", "content": _HINT_SYSTEM.format(length=HINT_LENGTHS[length])},
            {"role": "user", "content": f"```python\n{source}\n```\n\nWrite the hint."}]


def clean_hint(response: str, max_chars: int = 1_000) -> str:
    """The hint text: reasoning blocks and fences dropped, whitespace collapsed, length capped."""
    text = response
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    text = text.replace("```", " ")
    text = " ".join(text.split())
    return text[:max_chars]
