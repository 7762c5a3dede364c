"""Hidden Sequence -- skill: Pattern Recognition.

An integer sequence follows a secret rule drawn from a few well-known kinds. Only its first term
is shown. The agent reveals terms one at a time (positions 2..10 only), spots the rule, and
predicts a far-away term that cannot be revealed directly.
"""

import random
import re

PROBE_LIMIT = 10
RULE_KINDS = [
    "arithmetic (constant difference)",
    "quadratic (constant second difference)",
    "geometric (constant integer ratio)",
    "Fibonacci-style (each term is the sum of the two before)",
    "two interleaved arithmetic sequences (odd and even positions)",
    "double-plus-constant (each term is twice the previous plus a fixed number)",
]


def parse_action(action) -> str:
    """Strip a surrounding \\boxed{...}, lower-case and collapse whitespace."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    return " ".join(text.lower().split())


class HiddenSequenceEnv:
    def __init__(self, max_turns: int = 12):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.target_index = self.rng.randint(13, 18)
        self.terms = self._draw_sequence(self.target_index)
        self.revealed = {1}
        self.turn = 0
        self.terminated = False
        self.truncated = False
        return self._rules(), self._info()

    def _draw_sequence(self, length: int):
        """Return [None, t(1), ..., t(length)] for a randomly chosen kind of rule."""
        makers = [self._arithmetic, self._quadratic, self._geometric,
                  self._fibonacci, self._interleaved, self._double_plus]
        return [None] + makers[self.rng.randrange(len(makers))](length)

    def _arithmetic(self, length):
        start, step = self.rng.randint(-20, 30), self.rng.choice([-9, -7, -5, -3, 2, 3, 4, 6, 8, 11])
        return [start + step * (p - 1) for p in range(1, length + 1)]

    def _quadratic(self, length):
        a, b, c = self.rng.randint(1, 3), self.rng.randint(-6, 6), self.rng.randint(-5, 10)
        return [a * p * p + b * p + c for p in range(1, length + 1)]

    def _geometric(self, length):
        start, ratio = self.rng.randint(1, 5), self.rng.choice([2, 3])
        return [start * ratio ** (p - 1) for p in range(1, length + 1)]

    def _fibonacci(self, length):
        terms = [self.rng.randint(1, 9), self.rng.randint(1, 9)]
        while len(terms) < length:
            terms.append(terms[-1] + terms[-2])
        return terms

    def _interleaved(self, length):
        odd_start, even_start = self.rng.randint(0, 20), self.rng.randint(0, 20)
        odd_step, even_step = self.rng.sample([-4, -3, -2, 2, 3, 5, 7], 2)
        return [odd_start + odd_step * ((p - 1) // 2) if p % 2 else even_start + even_step * (p // 2 - 1)
                for p in range(1, length + 1)]

    def _double_plus(self, length):
        start = self.rng.randint(1, 6)
        offset = self.rng.choice([k for k in (-3, -2, -1, 1, 2, 3, 5) if k != -start])  # never constant
        terms = [start]
        while len(terms) < length:
            terms.append(2 * terms[-1] + offset)
        return terms

    def _rules(self) -> str:
        kinds = "\n".join(f"  - {kind}" for kind in RULE_KINDS)
        return (
            "A hidden integer sequence t(1), t(2), ... follows one of these kinds of rule:\n"
            f"{kinds}\nYou are told t(1) = {self.terms[1]}.\n"
            f"Goal: find t({self.target_index}). You may reveal terms at positions 2..{PROBE_LIMIT} only.\n"
            "Actions (one per turn, inside \\boxed{}):\n"
            "  \\boxed{term k}   -> reveals t(k)\n"
            f"  \\boxed{{answer x}} -> your final value for t({self.target_index}); a wrong answer ends the game\n"
            f"You have {self.max_turns} turns. Reward 1.0 for the right value, otherwise 0.0."
        )

    def _info(self) -> dict:
        return {"turn": self.turn, "turns_left": self.max_turns - self.turn, "revealed": sorted(self.revealed)}

    def step(self, action: str):
        if self.terminated or self.truncated:
            return "The game is over. Call reset() to play again.", 0.0, self.terminated, self.truncated, self._info()
        self.turn += 1
        observation, reward = self._apply(parse_action(action))
        if not self.terminated and self.turn >= self.max_turns:
            self.truncated = True
            reward = 0.0
            observation += f"\nYou are out of turns. t({self.target_index}) was {self.terms[self.target_index]}."
        return observation, reward, self.terminated, self.truncated, self._info()

    def _apply(self, command: str):
        probe = re.fullmatch(r"(?:term|t|reveal)\s*\(?\s*(-?\d{1,12})\s*\)?", command)
        if probe:
            return self._reveal(int(probe.group(1)))
        answer = re.fullmatch(r"(?:answer|guess)?\s*(-?\d{1,40})", command)
        if answer:
            return self._answer(int(answer.group(1)))
        return "Unrecognised action. Use \\boxed{term k} or \\boxed{answer x}.", 0.0

    def _reveal(self, index: int):
        if not 1 <= index <= PROBE_LIMIT:
            return f"Only positions 1..{PROBE_LIMIT} can be revealed.", 0.0
        self.revealed.add(index)
        return f"t({index}) = {self.terms[index]}", 0.0

    def _answer(self, value: int):
        self.terminated = True
        expected = self.terms[self.target_index]
        if value == expected:
            return f"Correct! t({self.target_index}) = {expected}.", 1.0
        return f"Wrong. t({self.target_index}) was {expected}.", 0.0
