"""Pass Word: a pass word and two decoy words are shown; say the pass word back. One reply ends the
game: it wins when it names the pass word and neither decoy.

A game for the learning check (docs/learning.md): SmolLM2-135M-Instruct often repeats the line with
the pass word but also copies more of the prompt, so its GRPO groups carry signal from the first
step. The decoys make a reply that copies the whole observation lose.
"""

import random
import re

WORDS = ("amber", "basil", "cedar", "delta", "ember", "fable", "grove", "harbor", "ivory", "jasper",
         "kettle", "lantern", "maple", "nectar", "orbit", "pepper", "quartz", "raven", "saddle", "timber")


def reply_words(action) -> set:
    """The words of the reply, lower-cased (a surrounding \\boxed{...} is stripped first)."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    return {word.lower() for word in re.findall(r"[A-Za-z]+", text)}


class PassWordEnv:
    def __init__(self, max_turns: int = 1):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.word, *self.decoys = rng.sample(WORDS, 3)
        self.done = False
        rules = (f"The pass word is {self.word}.\n"
                 "Reply with the pass word. Reward 1.0 when your reply names the pass word and no decoy word, "
                 "otherwise 0.0.\n"
                 f"Decoy words: {self.decoys[0]}, {self.decoys[1]}.")
        return rules, {"length": len(self.word)}

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        self.done = True
        words = reply_words(action)
        named = sorted(words & {self.word, *self.decoys})
        if named == [self.word]:
            return "Correct.", 1.0, True, False, {"named": named}
        return f"Wrong: the pass word was {self.word}.", 0.0, True, False, {"named": named}
