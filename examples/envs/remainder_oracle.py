"""Remainder Oracle -- skill: Mathematical Reasoning.

A secret whole number hides inside a known range. An oracle answers questions of the form
"what is the secret modulo k?" for a handful of allowed moduli. The agent combines the
remainders (Chinese-remainder style) until only one number in the range fits, then guesses it.
The range is always wide enough that two remainders never pin the number down.
"""

import math
import random
import re

MIN_WIDTH, MAX_WIDTH = 700, 999
MODULUS_POOL = range(3, 20)
ALLOWED_COUNT = 6


def parse_action(action) -> str:
    """Strip a surrounding \\boxed{...}, lower-case and collapse whitespace."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    return " ".join(text.lower().split())


class RemainderOracleEnv:
    def __init__(self, max_turns: int = 12):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.low, self.high, self.moduli = self._draw_puzzle()
        self.secret = self.rng.randint(self.low, self.high)
        self.turn = 0
        self.asked = []
        self.terminated = False
        self.truncated = False
        return self._rules(), self._info()

    def _draw_puzzle(self):
        while True:
            width = self.rng.randint(MIN_WIDTH, MAX_WIDTH)
            low = self.rng.randint(1, 3000)
            moduli = sorted(self.rng.sample(list(MODULUS_POOL), ALLOWED_COUNT))
            if math.lcm(*moduli) >= width:  # asking every modulus always identifies the secret
                return low, low + width - 1, moduli

    def _rules(self) -> str:
        allowed = ", ".join(str(m) for m in self.moduli)
        return (
            f"A secret whole number N lies between {self.low} and {self.high} (inclusive).\n"
            f"You may ask the oracle for N modulo k, where k is one of: {allowed}.\n"
            "Actions (one per turn, inside \\boxed{}):\n"
            "  \\boxed{mod k}   -> the oracle tells you N mod k\n"
            "  \\boxed{guess x} -> your final answer; a wrong guess ends the game\n"
            f"You have {self.max_turns} turns. Reward 1.0 for the right number, otherwise 0.0."
        )

    def _info(self) -> dict:
        return {"turn": self.turn, "turns_left": self.max_turns - self.turn, "asked_moduli": list(self.asked)}

    def step(self, action: str):
        if self.terminated or self.truncated:
            return "The game is over. Call reset() to play again.", 0.0, self.terminated, self.truncated, self._info()
        self.turn += 1
        observation, reward = self._apply(parse_action(action))
        if not self.terminated and self.turn >= self.max_turns:
            self.truncated = True
            reward = 0.0
            observation += f"\nYou are out of turns. The secret was {self.secret}."
        return observation, reward, self.terminated, self.truncated, self._info()

    def _apply(self, command: str):
        probe = re.fullmatch(r"(?:mod|modulo|probe|remainder)\s*(-?\d{1,12})", command)
        if probe:
            return self._ask(int(probe.group(1)))
        guess = re.fullmatch(r"(?:guess|answer)?\s*(-?\d{1,12})", command)
        if guess:
            return self._guess(int(guess.group(1)))
        return ("Unrecognised action. Use \\boxed{mod k} to ask a remainder or \\boxed{guess x} "
                "to answer."), 0.0

    def _ask(self, modulus: int):
        if modulus not in self.moduli:
            allowed = ", ".join(str(m) for m in self.moduli)
            return f"The oracle only answers for k in {{{allowed}}}. That question was wasted.", 0.0
        self.asked.append(modulus)
        return f"The oracle says: N mod {modulus} = {self.secret % modulus}.", 0.0

    def _guess(self, value: int):
        if not self.low <= value <= self.high:
            return f"{value} is outside the range {self.low}..{self.high}; guess again.", 0.0
        self.terminated = True
        if value == self.secret:
            return f"Correct! N = {self.secret}.", 1.0
        return f"Wrong. The secret was {self.secret}.", 0.0
