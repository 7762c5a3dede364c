"""Count On: a run of consecutive numbers is shown; give the next one. One reply ends the game; its
last number is the answer.

A game for the learning check (docs/learning.md): SmolLM2-135M-Instruct sometimes continues the
count as the last number of a short reply, so its GRPO groups carry signal from the first step.
"""

import random
import re


def parse_action(action) -> str:
    """The answer: the last whole number of the reply (a surrounding \\boxed{...} is stripped first)."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    numbers = re.findall(r"-?\d+", text)
    return numbers[-1] if numbers else ""


class CountOnEnv:
    def __init__(self, max_turns: int = 1):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        start = rng.randint(1, 80)
        self.shown = list(range(start, start + 4))
        self.done = False
        rules = (f"Continue the count: {', '.join(str(n) for n in self.shown)}, ?\n"
                 "Your answer is the last number in your reply. "
                 "Reward 1.0 for the next number, otherwise 0.0.")
        return rules, {"shown": self.shown}

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        self.done = True
        answer = parse_action(action)
        if answer == str(self.shown[-1] + 1):
            return "Correct.", 1.0, True, False, {"answer": answer}
        return f"Wrong: the next number is {self.shown[-1] + 1}.", 0.0, True, False, {"answer": answer}
