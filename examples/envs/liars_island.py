"""Liars' Island -- skill: Logical Deduction.

Every islander is a knight (always tells the truth) or a knave (always lies). The agent asks one
islander what they think of another and must deduce everybody's type. A reply "Y is a knight"
only shows that speaker and Y are of the same kind, so the agent has to chain replies and use the
announced number of knights to break the symmetry. Islanders tire after answering two questions.
"""

import random
import re

NAME_POOL = ["Ada", "Bram", "Cleo", "Dax", "Esme", "Finn", "Gus", "Hana",
             "Ivo", "Juno", "Kai", "Lena", "Milo", "Nia", "Otto", "Pia"]
MAX_ANSWERS_EACH = 2


def parse_action(action) -> str:
    """Strip a surrounding \\boxed{...}, lower-case and collapse whitespace."""
    text = str(action).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, flags=re.DOTALL)
    if boxed:
        text = boxed.group(1)
    return " ".join(text.lower().split())


class LiarsIslandEnv:
    def __init__(self, max_turns: int = 15):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        size = self.rng.randint(5, 7)
        self.names = self.rng.sample(NAME_POOL, size)
        knight_count = self.rng.choice([k for k in range(1, size) if 2 * k != size])
        self.knights = set(self.rng.sample(self.names, knight_count))
        self.answers_given = {name: 0 for name in self.names}
        self.turn = 0
        self.terminated = False
        self.truncated = False
        return self._rules(), self._info()

    def _rules(self) -> str:
        return (
            f"You land on an island with {len(self.names)} inhabitants: {', '.join(self.names)}.\n"
            "Each is a knight (always truthful) or a knave (always lies). "
            f"Exactly {len(self.knights)} of them are knights.\n"
            f"Each islander answers at most {MAX_ANSWERS_EACH} questions before getting tired.\n"
            "Actions (one per turn, inside \\boxed{}):\n"
            "  \\boxed{ask X about Y}     -> X tells you whether Y is a knight or a knave\n"
            "  \\boxed{knights A, B, ...} -> your final answer: the full list of knights\n"
            f"You have {self.max_turns} turns. Reward 1.0 for the exact set of knights, else 0.0."
        )

    def _info(self) -> dict:
        return {"turn": self.turn, "turns_left": self.max_turns - self.turn, "islanders": list(self.names)}

    def step(self, action: str):
        if self.terminated or self.truncated:
            return "The game is over. Call reset() to play again.", 0.0, self.terminated, self.truncated, self._info()
        self.turn += 1
        observation, reward = self._apply(parse_action(action))
        if not self.terminated and self.turn >= self.max_turns:
            self.truncated = True
            reward = 0.0
            observation += "\nYou are out of turns. The boat leaves without your answer."
        return observation, reward, self.terminated, self.truncated, self._info()

    def _apply(self, command: str):
        question = re.fullmatch(r"ask (\w+) about (\w+)", command)
        if question:
            return self._ask(question.group(1), question.group(2))
        verdict = re.fullmatch(r"knights?:?\s*(.*)", command)
        if verdict:
            return self._judge(re.findall(r"\w+", verdict.group(1)))
        return ("Unrecognised action. Use \\boxed{ask X about Y} or \\boxed{knights A, B, ...}."), 0.0

    def _lookup(self, word: str):
        return next((name for name in self.names if name.lower() == word), None)

    def _ask(self, speaker_word: str, subject_word: str):
        speaker, subject = self._lookup(speaker_word), self._lookup(subject_word)
        if speaker is None or subject is None:
            return f"Nobody here answers to that name. Islanders: {', '.join(self.names)}.", 0.0
        if self.answers_given[speaker] >= MAX_ANSWERS_EACH:
            return f"{speaker} is tired and refuses to answer any more questions.", 0.0
        self.answers_given[speaker] += 1
        if speaker == subject:
            return f"{speaker} says: \"I am a knight.\"", 0.0
        truth = subject in self.knights
        claim = truth if speaker in self.knights else not truth
        return f"{speaker} says: \"{subject} is a {'knight' if claim else 'knave'}.\"", 0.0

    def _judge(self, words):
        if not words:
            return "Name the knights, e.g. \\boxed{knights Ada, Bram}.", 0.0
        named = [] if words == ["none"] else [self._lookup(word) for word in words]
        if None in named:
            return f"Unknown name in your answer. Islanders: {', '.join(self.names)}.", 0.0
        self.terminated = True
        reveal = ", ".join(sorted(self.knights))
        if set(named) == self.knights:
            return f"Correct! The knights are {reveal}.", 1.0
        return f"Wrong. The knights were {reveal}.", 0.0
