"""Pass Word: a word is shown; say it back. One reply ends the game; its last word is the answer.

A game for the learning check (docs/learning.md): SmolLM2-135M-Instruct often repeats the word but
seldom ends its reply on it, so its GRPO groups carry signal from the first step.
"""

import random
import re

WORDS = ("amber", "basil", "cedar", "delta", "ember", "fable", "grove", "harbor", "ivory", "jasper",
         "kettle", "lantern", "maple", "nectar", "orbit", "pepper", "quartz", "raven", "saddle", "timber")


def parse_action(action) -> str:
    """The answer: the last word of the reply, lower-cased (a surrounding \\boxed{...} is stripped first)."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    words = re.findall(r"[A-Za-z]+", text)
    return words[-1].lower() if words else ""


class PassWordEnv:
    def __init__(self, max_turns: int = 1):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.word = rng.choice(WORDS)
        self.done = False
        rules = (f"The pass word is {self.word}.\n"
                 "Your answer is the last word of your reply, for example \\boxed{apple}. "
                 "Reward 1.0 for the pass word, otherwise 0.0.")
        return rules, {"length": len(self.word)}

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        self.done = True
        answer = parse_action(action)
        if answer == self.word:
            return "Correct.", 1.0, True, False, {"answer": answer}
        return f"Wrong: the pass word was {self.word}.", 0.0, True, False, {"answer": answer}
