import random
import re


class GuessNumberEnv:
    """Guess a secret number from 1 to 50; the last guess scores by closeness."""

    def __init__(self, max_turns=4):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 50)
        self.turn = 0
        return "Guess my number from 1 to 50 with \\boxed{N}. The closer your last guess, the more you score.", {}

    def step(self, action):
        self.turn += 1
        found = re.search(r"\d+", str(action))
        if found is None:
            return "Answer with a number, like \\boxed{25}.", 0.0, False, self.turn >= self.max_turns, {}
        guess = int(found.group())
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        if self.turn >= self.max_turns:
            reward = max(0.0, 1.0 - abs(guess - self.secret) / 10)
            return f"Out of guesses: it was {self.secret}.", reward, True, False, {}
        word = "higher" if guess < self.secret else "lower"
        return f"Wrong, go {word}.", 0.0, False, False, {}
