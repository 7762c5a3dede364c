import random
import re


class GuessNumberEnv:
    """Find a secret number from 1 to 50; a guess within 5 of it wins, scored by closeness."""

    def __init__(self, max_turns=6, **kwargs):
        self.max_turns = max_turns
        self.secret = 0
        self.turn_count = 0
        self.best = float("inf")
        self.reset()

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 50)
        self.turn_count = 0
        self.best = float("inf")
        return ("I am thinking of a number from 1 to 50. A guess within 5 of it wins; the closer, the more "
                "you score. Reply with your guess as \\boxed{N}."), {}

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        found = re.search(r"\d+", str(action))
        if found is None:
            return "Guesses are numbers. Reply with your guess as \\boxed{N}.", 0.0, False, truncated, {}
        guess = int(found.group())
        distance = abs(guess - self.secret)
        if distance <= 5:
            return f"{guess} wins: the number was {self.secret}.", 1.0 - distance / 6, True, False, {}
        progress = 0.1 if distance < self.best else 0.0  # closer than any guess before
        self.best = min(self.best, distance)
        word = "higher" if guess < self.secret else "lower"
        return (f"{guess} is too far: go {word}. Guesses left: {self.max_turns - self.turn_count}. "
                "Reply with your next guess as \\boxed{N}."), progress, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.secret}}}"

    def close(self):
        pass
