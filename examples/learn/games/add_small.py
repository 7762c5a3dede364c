"""Small Sum: add two one-digit numbers. One reply ends the game; its last number is the answer.

A game for the learning check (docs/learning.md): SmolLM2-135M-Instruct rarely uses \\boxed{} and
often wanders off, but it sometimes writes the sum as the last number of a short reply, so its
GRPO groups carry signal from the first step.
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


class SmallSumEnv:
    def __init__(self, max_turns: int = 1):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.a, self.b = rng.randint(1, 9), rng.randint(1, 9)
        self.done = False
        rules = (f"What is {self.a} + {self.b}?\n"
                 "Your answer is the last number in your reply. "
                 "Reward 1.0 for the right sum, otherwise 0.0.")
        return rules, {"terms": [self.a, self.b]}

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        self.done = True
        answer = parse_action(action)
        if answer == str(self.a + self.b):
            return "Correct.", 1.0, True, False, {"answer": answer}
        return f"Wrong: {self.a} + {self.b} = {self.a + self.b}.", 0.0, True, False, {"answer": answer}
