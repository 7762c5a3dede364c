"""Scripted reference solvers for the hand-written example environments in examples/envs/.

The tests use them to prove every example is winnable; ``spade demo`` plays them through the
sandbox beside a random policy.

Each solver plays one episode through the public reset/step API only. It reads the observation
text (never the environment's attributes) and returns the transcript as a list of
(action, observation, reward, terminated, truncated) tuples.
"""

import itertools
import re
from fractions import Fraction


class Episode:
    """Thin recorder around an environment: sends boxed actions and keeps the transcript."""

    def __init__(self, env, seed):
        self.env = env
        self.observation, _ = env.reset(seed=seed)
        self.transcript = []

    def act(self, action: str) -> str:
        boxed = "\\boxed{" + action + "}"
        observation, reward, terminated, truncated, _ = self.env.step(boxed)
        self.transcript.append((boxed, observation, reward, terminated, truncated))
        self.observation = observation
        return observation

    @property
    def over(self) -> bool:
        return bool(self.transcript) and (self.transcript[-1][3] or self.transcript[-1][4])


# --- Mathematical Reasoning -------------------------------------------------------------------

def solve_remainder_oracle(env, seed):
    episode = Episode(env, seed)
    low, high = map(int, re.search(r"between (\d+) and (\d+)", episode.observation).groups())
    moduli = [int(m) for m in re.search(r"one of: ([\d, ]+)\.", episode.observation).group(1).split(",")]
    candidates = list(range(low, high + 1))
    for modulus in sorted(moduli, reverse=True):
        if len(candidates) == 1:
            break
        reply = episode.act(f"mod {modulus}")
        remainder = int(re.search(r"= (\d+)", reply).group(1))
        candidates = [n for n in candidates if n % modulus == remainder]
    episode.act(f"guess {candidates[0]}")
    return episode.transcript


# --- Logical Deduction ------------------------------------------------------------------------

def solve_liars_island(env, seed):
    episode = Episode(env, seed)
    names = re.search(r"inhabitants: ([^.]+)\.", episode.observation).group(1).split(", ")
    knight_count = int(re.search(r"Exactly (\d+) of them", episode.observation).group(1))
    same_as_first = {names[0]: True}
    for speaker, subject in zip(names, names[1:]):  # a chain: nobody answers more than twice
        reply = episode.act(f"ask {speaker} about {subject}")
        same_kind = "is a knight" in reply
        same_as_first[subject] = same_as_first[speaker] == same_kind
    first_group = [name for name in names if same_as_first[name]]
    other_group = [name for name in names if not same_as_first[name]]
    knights = first_group if len(first_group) == knight_count else other_group
    episode.act("knights " + ", ".join(knights))
    return episode.transcript


# --- Spatial Reasoning ------------------------------------------------------------------------

MOVES = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}


def _first_step_towards(start, goal, blocked, size):
    """Breadth-first search treating unseen cells as open; returns the first move's name."""
    parents, frontier = {start: None}, [start]
    while frontier and goal not in parents:
        next_frontier = []
        for row, col in frontier:
            for name, (d_row, d_col) in MOVES.items():
                cell = (row + d_row, col + d_col)
                inside = 0 <= cell[0] < size and 0 <= cell[1] < size
                if inside and cell not in blocked and cell not in parents:
                    parents[cell] = ((row, col), name)
                    next_frontier.append(cell)
        frontier = next_frontier
    cell, move = goal, None
    while parents[cell] is not None:
        cell, move = parents[cell]
    return move


def _read_view(observation, blocked):
    row, col = map(int, re.search(r"You are at row (\d+), col (\d+)", observation).groups())
    grid_lines = observation.split("Around you:\n")[1].splitlines()[:3]
    for d_row, line in zip((-1, 0, 1), grid_lines):
        for d_col, symbol in zip((-1, 0, 1), line.split()):
            if symbol == "#":
                blocked.add((row + d_row, col + d_col))
    return row, col


def solve_foggy_grid(env, seed):
    episode = Episode(env, seed)
    size = int(re.search(r"on a (\d+)x", episode.observation).group(1))
    goal = tuple(map(int, re.search(r"exit is at row (\d+), col (\d+)", episode.observation).groups()))
    blocked = set()
    while not episode.over:
        position = _read_view(episode.observation, blocked)
        episode.act("move " + _first_step_towards(position, goal, blocked, size))
    return episode.transcript


# --- Pattern Recognition ----------------------------------------------------------------------

def _predictions(terms, index):
    """Values t(index) predicted by every rule kind consistent with the known terms t(1..n)."""
    t = [None] + terms
    n = len(terms)
    fits = []
    # arithmetic and quadratic: extend with constant second differences
    if all(t[k] - 2 * t[k - 1] + t[k - 2] == t[3] - 2 * t[2] + t[1] for k in range(4, n + 1)):
        fits.append(_extend(t, index, lambda s: 2 * s[-1] - s[-2] + (t[3] - 2 * t[2] + t[1])))
    if t[1] != 0 and Fraction(t[2], t[1]).denominator == 1:
        ratio = t[2] // t[1]
        if all(t[k] == ratio * t[k - 1] for k in range(2, n + 1)):
            fits.append(_extend(t, index, lambda s: ratio * s[-1]))
    if all(t[k] == t[k - 1] + t[k - 2] for k in range(3, n + 1)):
        fits.append(_extend(t, index, lambda s: s[-1] + s[-2]))
    if all(t[k] - t[k - 2] == t[k - 2] - t[k - 4] for k in range(5, n + 1)):
        fits.append(_extend(t, index, lambda s: 2 * s[-2] - s[-4]))
    offset = t[2] - 2 * t[1]
    if all(t[k] == 2 * t[k - 1] + offset for k in range(2, n + 1)):
        fits.append(_extend(t, index, lambda s: 2 * s[-1] + offset))
    return set(fits)


def _extend(t, index, rule):
    seq = list(t[1:])
    while len(seq) < index:
        seq.append(rule(seq))
    return seq[index - 1]


def solve_hidden_sequence(env, seed):
    episode = Episode(env, seed)
    terms = [int(re.search(r"t\(1\) = (-?\d+)", episode.observation).group(1))]
    target = int(re.search(r"Goal: find t\((\d+)\)", episode.observation).group(1))
    limit = int(re.search(r"positions 2\.\.(\d+)", episode.observation).group(1))
    while len(terms) < 6 or (len(_predictions(terms, target)) > 1 and len(terms) < limit):
        reply = episode.act(f"term {len(terms) + 1}")
        terms.append(int(re.search(r"= (-?\d+)", reply).group(1)))
    episode.act(f"answer {min(_predictions(terms, target))}")
    return episode.transcript


# --- Optimization -----------------------------------------------------------------------------

def solve_crate_loading(env, seed):
    episode = Episode(env, seed)
    capacity = int(re.search(r"at most (\d+) kg", episode.observation).group(1))
    crates = re.findall(r"([A-Z]) \(value (\d+)\)", episode.observation)
    labels, values = [c[0] for c in crates], [int(c[1]) for c in crates]
    weights = []
    for label in labels:
        reply = episode.act(f"load {label}")
        weights.append(int(re.search(r"total weight (\d+) kg", reply).group(1)))
    best, best_value = (), -1
    for size in range(len(labels) + 1):
        for group in itertools.combinations(range(len(labels)), size):
            value = sum(values[i] for i in group)
            if sum(weights[i] for i in group) <= capacity and value > best_value:
                best, best_value = group, value
    episode.act("load " + " ".join(labels[i] for i in best))
    return episode.transcript


# --- Causal Inference -------------------------------------------------------------------------

def _read_lights(observation):
    return [state == "ON" for state in re.findall(r"\d:(ON|off)", observation.split("Lights:")[-1])]


def solve_switchboard(env, seed):
    episode = Episode(env, seed)
    switches = re.search(r"switches ([A-Z, ]+) \(all down\)", episode.observation).group(1).split(", ")
    target = _read_lights(episode.observation.split("target pattern:")[1].split("\n")[0])
    lights = _read_lights(episode.observation)
    effects = {}
    for switch in switches:  # intervene on each switch once and record what it changed
        after = _read_lights(episode.act(f"flip {switch}"))
        effects[switch] = [a != b for a, b in zip(after, lights)]
        lights = after
        if episode.over:
            return episode.transcript
    for size in range(len(switches) + 1):
        for group in itertools.combinations(switches, size):
            result = list(lights)
            for switch in group:
                result = [on != toggled for on, toggled in zip(result, effects[switch])]
            if result == target:
                for switch in group:
                    episode.act(f"flip {switch}")
                return episode.transcript
    return episode.transcript


SOLVERS = {
    "remainder_oracle": solve_remainder_oracle,
    "liars_island": solve_liars_island,
    "foggy_grid": solve_foggy_grid,
    "hidden_sequence": solve_hidden_sequence,
    "crate_loading": solve_crate_loading,
    "switchboard": solve_switchboard,
}
