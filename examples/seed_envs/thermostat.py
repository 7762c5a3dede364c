import random
import re


class ThermostatEnv:
    """Find the hidden ideal temperature from 10 to 40; a setting within 2 of it wins, scored by closeness."""

    def __init__(self, max_turns=6, **kwargs):
        self.max_turns = max_turns
        self.target = 0
        self.turn_count = 0
        self.best = float("inf")
        self.reset()

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(10, 40)
        self.turn_count = 0
        self.best = float("inf")
        return ("Set the thermostat from 10 to 40. A setting within 2 of the ideal temperature wins; the "
                "closer, the more you score. Reply with a setting as \\boxed{T}."), {}

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        found = re.search(r"\d+", str(action))
        if found is None:
            return "Settings are numbers. Reply with a setting as \\boxed{T}.", 0.0, False, truncated, {}
        setting = int(found.group())
        distance = abs(setting - self.target)
        if distance <= 2:
            return f"{setting} feels right: the ideal was {self.target}.", 1.0 - distance / 3, True, False, {}
        progress = 0.1 if distance < self.best else 0.0  # closer than any setting before
        self.best = min(self.best, distance)
        word = "warmer" if setting < self.target else "colder"
        return (f"At {setting} the room should be {word}. Settings left: {self.max_turns - self.turn_count}. "
                "Reply with your next setting as \\boxed{T}."), progress, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.target}}}"

    def close(self):
        pass
