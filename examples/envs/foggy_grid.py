"""Foggy Grid -- skill: Spatial Reasoning.

The agent walks a rocky grid towards a known exit but only sees the 3x3 patch around itself.
It must remember what it has seen, build a mental map, and re-plan around rocks as they appear
out of the fog. Start and exit are always far apart, so many moves are needed.
"""

import collections
import random
import re

SIZE = 7
ROCK_CHANCE = 0.27
MIN_DISTANCE, MAX_PATH = 6, 14
DIRECTIONS = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
ALIASES = {"n": "north", "up": "north", "s": "south", "down": "south",
           "e": "east", "right": "east", "w": "west", "left": "west"}


def parse_action(action) -> str:
    """Strip a surrounding \\boxed{...}, lower-case and collapse whitespace."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    return " ".join(text.lower().split())


class FoggyGridEnv:
    def __init__(self, max_turns: int = 24):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.rocks, self.position, self.exit = self._draw_map()
        self.turn = 0
        self.terminated = False
        self.truncated = False
        return self._rules() + "\n" + self._view(), self._info()

    def _draw_map(self):
        cells = [(r, c) for r in range(SIZE) for c in range(SIZE)]
        while True:
            start, goal = self.rng.sample(cells, 2)
            if abs(start[0] - goal[0]) + abs(start[1] - goal[1]) < MIN_DISTANCE:
                continue
            rocks = {cell for cell in cells if cell not in (start, goal) and self.rng.random() < ROCK_CHANCE}
            length = self._path_length(rocks, start, goal)
            if length is not None and length <= MAX_PATH:
                return rocks, start, goal

    @staticmethod
    def _path_length(rocks, start, goal):
        frontier, seen = collections.deque([(start, 0)]), {start}
        while frontier:
            (row, col), dist = frontier.popleft()
            if (row, col) == goal:
                return dist
            for d_row, d_col in DIRECTIONS.values():
                nxt = (row + d_row, col + d_col)
                if 0 <= nxt[0] < SIZE and 0 <= nxt[1] < SIZE and nxt not in rocks and nxt not in seen:
                    seen.add(nxt)
                    frontier.append((nxt, dist + 1))
        return None

    def _rules(self) -> str:
        return (
            f"You are lost in fog on a {SIZE}x{SIZE} grid (rows and columns 0..{SIZE - 1}; row 0 is the "
            "northern edge, column 0 the western edge). Rocks block some cells.\n"
            f"The exit is at row {self.exit[0]}, col {self.exit[1]}. You only see the 3x3 cells around you: "
            "'@' you, '.' open, '#' rock or edge, 'X' the exit.\n"
            "Actions (one per turn, inside \\boxed{}): \\boxed{move north}, \\boxed{move south}, "
            "\\boxed{move east}, \\boxed{move west}.\n"
            f"You have {self.max_turns} turns. Reward 1.0 for reaching the exit, otherwise 0.0."
        )

    def _symbol(self, cell) -> str:
        if cell == self.position:
            return "@"
        if not (0 <= cell[0] < SIZE and 0 <= cell[1] < SIZE) or cell in self.rocks:
            return "#"
        return "X" if cell == self.exit else "."

    def _view(self) -> str:
        row, col = self.position
        lines = [" ".join(self._symbol((row + dr, col + dc)) for dc in (-1, 0, 1)) for dr in (-1, 0, 1)]
        return f"You are at row {row}, col {col}. Around you:\n" + "\n".join(lines)

    def _info(self) -> dict:
        return {"turn": self.turn, "turns_left": self.max_turns - self.turn, "position": list(self.position)}

    def step(self, action: str):
        if self.terminated or self.truncated:
            return "The game is over. Call reset() to play again.", 0.0, self.terminated, self.truncated, self._info()
        self.turn += 1
        observation, reward = self._apply(parse_action(action))
        if not self.terminated and self.turn >= self.max_turns:
            self.truncated = True
            reward = 0.0
            observation += "\nYou are out of turns; the fog swallows you."
        return observation, reward, self.terminated, self.truncated, self._info()

    def _apply(self, command: str):
        match = re.fullmatch(r"(?:move|go|walk)?\s*(\w+)", command)
        direction = ALIASES.get(match.group(1), match.group(1)) if match else None
        if direction not in DIRECTIONS:
            return "Unrecognised action. Use \\boxed{move north|south|east|west}.\n" + self._view(), 0.0
        d_row, d_col = DIRECTIONS[direction]
        target = (self.position[0] + d_row, self.position[1] + d_col)
        if self._symbol(target) == "#":
            return f"A rock or the edge blocks the way {direction}.\n" + self._view(), 0.0
        self.position = target
        if target == self.exit:
            self.terminated = True
            return f"You step {direction} onto the exit and escape the fog!", 1.0
        return f"You move {direction}.\n" + self._view(), 0.0
