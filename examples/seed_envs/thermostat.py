import random
import re


class ThermostatEnv:
    """Find the hidden ideal temperature from 10 to 40; the last setting scores by closeness."""

    def __init__(self, max_turns=4):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(10, 40)
        self.turn = 0
        return "Set the thermostat from 10 to 40 with \\boxed{T}. The closer your last setting, the more you score.", {}

    def step(self, action):
        self.turn += 1
        found = re.search(r"\d+", str(action))
        if found is None:
            return "Answer with a temperature, like \\boxed{25}.", 0.0, False, self.turn >= self.max_turns, {}
        setting = int(found.group())
        if setting == self.target:
            return "Perfect!", 1.0, True, False, {}
        if self.turn >= self.max_turns:
            reward = max(0.0, 1.0 - abs(setting - self.target) / 5)
            return f"Out of turns: it was {self.target}.", reward, True, False, {}
        word = "warmer" if setting < self.target else "colder"
        return f"Not yet, go {word}.", 0.0, False, False, {}
