"""Switchboard -- skill: Causal Inference.

Five switches are wired to five lights through hidden wiring: flipping a switch toggles every
light it is wired to, and a light may depend on several switches. The agent intervenes one switch
at a time, attributes each observed change to its cause, and uses the inferred wiring to reach a
target pattern of lights. The target always needs at least three flips, so guessing rarely works.
"""

import itertools
import random
import re

SWITCHES = "ABCDE"
LIGHT_COUNT = 5
MIN_FLIPS = 3
PROGRESS_SCALE = 0.3


def parse_action(action) -> str:
    """Strip a surrounding \\boxed{...}, lower-case and collapse whitespace."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    return " ".join(text.lower().split())


class SwitchboardEnv:
    def __init__(self, max_turns: int = 16):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.wiring, self.lights, self.target = self._draw_board()
        self.switch_up = [False] * len(SWITCHES)
        self.turn = 0
        self.terminated = False
        self.truncated = False
        return self._rules() + "\n" + self._status(), self._info()

    def _draw_board(self):
        """wiring[s] is the set of lights that switch s toggles."""
        while True:
            wiring = [set(self.rng.sample(range(LIGHT_COUNT), self.rng.randint(0, 3))) for _ in SWITCHES]
            lights = [self.rng.random() < 0.5 for _ in range(LIGHT_COUNT)]
            target = [self.rng.random() < 0.5 for _ in range(LIGHT_COUNT)]
            flips = self._fewest_flips(wiring, lights, target)
            if flips is not None and flips >= MIN_FLIPS:
                return wiring, lights, target

    @staticmethod
    def _fewest_flips(wiring, lights, target):
        """Smallest number of switch flips turning `lights` into `target` (None if impossible)."""
        for count in range(len(wiring) + 1):
            for group in itertools.combinations(range(len(wiring)), count):
                result = list(lights)
                for switch in group:
                    for light in wiring[switch]:
                        result[light] = not result[light]
                if result == target:
                    return count
        return None

    def _rules(self) -> str:
        return (
            f"A switchboard has switches {', '.join(SWITCHES)} (all down) and lights 1-{LIGHT_COUNT}. "
            "Hidden wires connect switches to lights: flipping a switch toggles every light wired to it "
            "(a switch may be wired to several lights, or to none).\n"
            f"Goal: make the lights show the target pattern: {self._pattern(self.target)}.\n"
            "Action (one per turn, inside \\boxed{}): \\boxed{flip B} flips one switch.\n"
            f"Reward 1.0 when the lights match the target; before that, up to {PROGRESS_SCALE} for partial "
            f"matches. You have {self.max_turns} turns."
        )

    @staticmethod
    def _pattern(states) -> str:
        return " ".join(f"{i + 1}:{'ON' if on else 'off'}" for i, on in enumerate(states))

    def _status(self) -> str:
        switches = " ".join(f"{name}:{'up' if up else 'down'}" for name, up in zip(SWITCHES, self.switch_up))
        return f"Switches: {switches}\nLights:   {self._pattern(self.lights)}"

    def _matches(self) -> int:
        return sum(a == b for a, b in zip(self.lights, self.target))

    def _info(self) -> dict:
        return {"turn": self.turn, "turns_left": self.max_turns - self.turn, "lights_matching": self._matches()}

    def step(self, action: str):
        if self.terminated or self.truncated:
            return "The game is over. Call reset() to play again.", 0.0, self.terminated, self.truncated, self._info()
        self.turn += 1
        observation, reward = self._apply(parse_action(action))
        if not self.terminated and self.turn >= self.max_turns:
            self.truncated = True
            reward = 0.0
            observation += "\nYou are out of turns."
        return observation, reward, self.terminated, self.truncated, self._info()

    def _apply(self, command: str):
        match = re.fullmatch(r"(?:flip|toggle|switch)?\s*([a-z])", command)
        if not match or match.group(1).upper() not in SWITCHES:
            return f"Unrecognised action. Use \\boxed{{flip X}} with X one of {', '.join(SWITCHES)}.\n" + \
                self._status(), 0.0
        return self._flip(SWITCHES.index(match.group(1).upper()))

    def _flip(self, switch: int):
        self.switch_up[switch] = not self.switch_up[switch]
        for light in self.wiring[switch]:
            self.lights[light] = not self.lights[light]
        report = f"You flip switch {SWITCHES[switch]}.\n" + self._status()
        if self.lights == self.target:
            self.terminated = True
            return report + "\nThe lights match the target. You win!", 1.0
        return report, PROGRESS_SCALE * self._matches() / LIGHT_COUNT
