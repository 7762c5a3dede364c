"""Crate Loading -- skill: Optimization.

A knapsack with a twist: every crate's value is printed on it, but its weight is hidden. The
agent test-loads sets of crates onto a scale-equipped truck; each trial reports total weight and
value. It must learn enough about the weights to find a load of maximum value that fits the
capacity. Feasible but sub-optimal loads earn a partial reward; only an optimal load wins.
"""

import itertools
import random
import re
import string

PARTIAL_SCALE = 0.5
MIN_OPTIMAL_SIZE = 3


def parse_action(action) -> str:
    """Strip a surrounding \\boxed{...}, lower-case and collapse whitespace."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    return " ".join(text.lower().split())


def best_value(weights, values, capacity) -> int:
    """Exhaustive 0/1 knapsack (at most 2^7 subsets)."""
    best = 0
    for mask in itertools.product((0, 1), repeat=len(weights)):
        if sum(w for w, m in zip(weights, mask) if m) <= capacity:
            best = max(best, sum(v for v, m in zip(values, mask) if m))
    return best


class CrateLoadingEnv:
    def __init__(self, max_turns: int = 12):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.labels, self.values, self.weights, self.capacity = self._draw_crates()
        self.optimum = best_value(self.weights, self.values, self.capacity)
        self.best_so_far = 0
        self.turn = 0
        self.terminated = False
        self.truncated = False
        return self._rules(), self._info()

    def _draw_crates(self):
        while True:
            count = self.rng.randint(5, 7)
            labels = list(string.ascii_uppercase[:count])
            values = [self.rng.randint(3, 20) for _ in labels]
            weights = [self.rng.randint(2, 12) for _ in labels]
            capacity = max(max(weights), round(sum(weights) * self.rng.uniform(0.4, 0.6)))
            if self._needs_big_load(weights, values, capacity):
                return labels, values, weights, capacity

    @staticmethod
    def _needs_big_load(weights, values, capacity) -> bool:
        """True when no load of fewer than MIN_OPTIMAL_SIZE crates is optimal."""
        optimum = best_value(weights, values, capacity)
        for size in range(MIN_OPTIMAL_SIZE):
            for group in itertools.combinations(range(len(weights)), size):
                if sum(weights[i] for i in group) <= capacity and sum(values[i] for i in group) == optimum:
                    return False
        return True

    def _rules(self) -> str:
        crates = ", ".join(f"{label} (value {value})" for label, value in zip(self.labels, self.values))
        return (
            f"A truck can carry at most {self.capacity} kg. Crates: {crates}.\n"
            "Each crate's weight is hidden (a whole number of kg). Find a load with the highest total value "
            "that does not exceed the capacity.\n"
            "Action (one per turn, inside \\boxed{}): \\boxed{load A C D} puts exactly those crates on the "
            "truck's scale and reports their total weight and value.\n"
            "An optimal load that fits wins (reward 1.0). A load that fits but is not optimal earns a small "
            f"partial reward; an overweight load earns 0. You have {self.max_turns} turns."
        )

    def _info(self) -> dict:
        return {"turn": self.turn, "turns_left": self.max_turns - self.turn, "best_value_so_far": self.best_so_far}

    def step(self, action: str):
        if self.terminated or self.truncated:
            return "The game is over. Call reset() to play again.", 0.0, self.terminated, self.truncated, self._info()
        self.turn += 1
        observation, reward = self._apply(parse_action(action))
        if not self.terminated and self.turn >= self.max_turns:
            self.truncated = True
            reward = 0.0
            observation += f"\nYou are out of turns. The best possible value was {self.optimum}."
        return observation, reward, self.terminated, self.truncated, self._info()

    def _apply(self, command: str):
        tokens = re.sub(r"^load\b", "", command).replace(",", " ").split()
        chosen = [self.labels.index(token.upper()) for token in tokens if token.upper() in self.labels]
        if not tokens or len(chosen) != len(tokens) or len(set(chosen)) != len(chosen):
            return (f"Unrecognised load. Use \\boxed{{load A C}} with distinct crates from "
                    f"{', '.join(self.labels)}."), 0.0
        return self._weigh(sorted(chosen))

    def _weigh(self, chosen):
        weight = sum(self.weights[i] for i in chosen)
        value = sum(self.values[i] for i in chosen)
        names = " ".join(self.labels[i] for i in chosen)
        report = f"Load [{names}]: total weight {weight} kg (capacity {self.capacity}), total value {value}."
        if weight > self.capacity:
            return report + " Overweight!", 0.0
        self.best_so_far = max(self.best_so_far, value)
        if value == self.optimum:
            self.terminated = True
            return report + " It fits, and no better load exists. You win!", 1.0
        partial = round(PARTIAL_SCALE * value / self.optimum, 3)
        return report + " It fits, but a more valuable load exists.", partial
