"""Share of a self-play step's time spent outside the engine and the train step.

    python benchmarks/step_overhead.py [--scale S] [--engine-tokens-per-s R] [--train-tokens-per-s R] [--json]

What runs. The real :class:`~spade.selfplay.orchestrator.Orchestrator` ``run_step`` at the paper's
batch sizes (24 environments per set, 16 no-hint + 16 hinted plays per environment, 25 turns,
k = 4, ``plays.max_concurrent`` 64), for one regeneration step (step 0: designer calls,
admission in the sandbox, hints, hinted and no-hint plays, memory) and one ordinary step (step 1:
no-hint plays), through the real sandbox service (bubblewrap, default pool), the real corpus
(``examples/corpus/demo.jsonl.gz``), memory, token-exact conversations and sample building, with
a real tokenizer (the embedded SmolLM2 tokenizer when it is available, else the tests' byte-level
BPE ChatML tokenizer).

What is replaced. Only the model: :class:`ReplayEngine` answers every ``generate`` at once with
prepared outputs: designer calls get one of the six example environments' sources (in turn) in a
```python fence after a paragraph of design notes; hint calls a short fixed hint; agent turns a
reply of about ``--reply-tokens`` tokens of reasoning text plus a boxed action drawn from a small
per-game list of plausible, non-final actions (so episodes mostly run to the turn budget; the
games can still be won by chance), tokenised once, log-probs -1.0. The time spent inside
``generate`` is counted as engine time; it is replay bookkeeping only (no model compute).

The figures. ``overhead_s`` = wall time of ``run_step`` minus the time inside the replay engine:
orchestration, sandbox round trips, chat-template rendering and tokenisation, sample building.
A real step also spends time in the engine and in the train step, neither of which runs here, so
they are estimated from this step's token counts at stated rates:

* ``engine_s = generated tokens / --engine-tokens-per-s`` (default 20,000 tokens/s: an 8-GPU
  SGLang node serving a 30B-A3B MoE at high concurrency). Prefill is not counted (prefix caching
  makes later turns' prompts mostly cached), which understates the engine time;
* ``train_s = training tokens (every token of every sample: prompt + response) /
  --train-tokens-per-s`` (default 10,000 tokens/s for the whole GRPO update, log-prob pass
  included).

``share = overhead_s / (overhead_s + engine_s + train_s)``, i.e. assuming no overlap between the
orchestrator's CPU work and the engine (conservative: in a real run the sandbox steps and the
tokenisation of one episode overlap other episodes' generation). The primary figure is the share
over one regeneration window (one regeneration step + k - 1 ordinary steps, each ordinary step
costed like the measured step 1); PASS when it is under 5 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from spade.designer.corpus import Corpus, CorpusSettings  # noqa: E402
from spade.designer.memory import Memory  # noqa: E402
from spade.designer.prompts import DESIGNER_SYSTEM, HINT_SYSTEM  # noqa: E402
from spade.envs.sandbox.client import SandboxService  # noqa: E402
from spade.envs.sandbox.config import SandboxConfig  # noqa: E402
from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine  # noqa: E402
from spade.selfplay.orchestrator import Orchestrator, StepOutput  # noqa: E402
from spade.selfplay.settings import SelfPlaySettings  # noqa: E402
from spade.selfplay.step import Step  # noqa: E402

TARGET_SHARE = 0.05
EXAMPLE_ENVS = REPO_ROOT / "examples" / "envs"
DEMO_CORPUS = REPO_ROOT / "examples" / "corpus" / "demo.jsonl.gz"
ENV_FILES = ("remainder_oracle.py", "liars_island.py", "foggy_grid.py", "hidden_sequence.py", "crate_loading.py",
             "switchboard.py")
HINT_TEXT = ("Gather information with the cheap actions first and keep a written record of what each "
             "observation rules out; commit to a final answer only when a single candidate is left. "
             "Answer with one action inside \\boxed{}.")
DESIGN_NOTES = (
    "Design notes. The environment should hide its state behind several interaction steps, so that the "
    "agent has to gather evidence before it can commit to an answer. The observation must never reveal the "
    "answer; every fact the agent needs can be derived from the replies to its actions. Rewards stay in "
    "[0, 1], with 1.0 only for full success, and all randomness comes from the seed passed to reset. I keep "
    "to the standard library, make unrecognised actions cost a turn with an explanation of the syntax, and "
    "end the episode when the turn budget is spent. Here is the implementation:\n"
)
REASONING = (
    "Let me look at what the last observation tells me. It narrows the possibilities, but not enough to "
    "commit to a final answer yet, and a wrong final answer would end the game. The safest useful move is to "
    "gather one more piece of evidence, keep track of what it rules out, and then decide what to try next. "
    "I will take an informative action now and revisit the candidates after the reply. "
)
# Markers in the first observation -> game; non-final (mostly informative, some invalid) actions;
# final actions (used with probability --final-rate).
GAMES: dict[str, dict[str, Any]] = {
    "remainder_oracle": {"marker": "secret whole number",
                         "actions": ["mod 4", "mod 5", "mod 7", "mod 9", "mod 11", "mod 13", "mod 16", "ask mod"],
                         "final": ["guess 777", "guess 2500"]},
    "liars_island": {"marker": "knight (always truthful)",
                     "actions": ["ask Cleo about Bram", "ask Esme about Hana", "ask Milo about Finn",
                                 "ask Bram about Esme", "ask Hana about Cleo", "who is a knight?"],
                     "final": ["knights Cleo, Esme", "knights Bram"]},
    "foggy_grid": {"marker": "lost in fog",
                   "actions": ["move north", "move south", "move east", "move west", "move north", "wait"],
                   "final": []},
    "hidden_sequence": {"marker": "hidden integer sequence",
                        "actions": ["term 2", "term 3", "term 4", "term 5", "term 7", "term 10", "term 12"],
                        "final": ["answer 42", "answer 100"]},
    "crate_loading": {"marker": "A truck can carry",
                      "actions": ["load A", "load B C", "load A C", "load A B C D E", "load D E", "load crate"],
                      "final": []},
    "switchboard": {"marker": "switchboard has switches",
                    "actions": ["flip A", "flip B", "flip C", "flip D", "flip E", "flip F"],
                    "final": []},
}
DEFAULT_GAME = {"actions": ["look around", "next"], "final": []}


# --------------------------------------------------------------------------- the replay engine


@dataclass
class RoleCounts:
    calls: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0


@dataclass
class EngineCounts:
    seconds: float = 0.0  # time inside generate (replay bookkeeping, not model compute)
    roles: dict[str, RoleCounts] = field(
        default_factory=lambda: {role: RoleCounts() for role in ("designer", "hint", "agent")})
    games: Counter = field(default_factory=Counter)

    @property
    def generated_tokens(self) -> int:
        return sum(r.generated_tokens for r in self.roles.values())


class ReplayEngine(RolloutEngine):
    """A :class:`RolloutEngine` that replays prepared outputs instantly (see the module docstring).

    The role of a request is read from the start of its prompt (the designer and hint system
    prompts; for the agent, the game's first observation). Agent replies are chosen with the
    request's sampling seed, so a run is reproducible.
    """

    def __init__(self, tokenizer: Any, *, eos_id: int, reply_tokens: int, final_rate: float):
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.final_rate = final_rate
        self.counts = EngineCounts()
        self._closed = False
        sources = [(EXAMPLE_ENVS / name).read_text() for name in ENV_FILES]
        self._designer = [self._encode(f"{DESIGN_NOTES}```python\n{source}\n```") for source in sources]
        self._designer_calls = 0
        self._hint = self._encode(HINT_TEXT)
        reasoning = self._reasoning(reply_tokens)
        self._replies: dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = {}
        for name, game in list(GAMES.items()) + [("unknown", DEFAULT_GAME)]:
            make = [self._encode(f"{reasoning}\n\n\\boxed{{{action}}}") for action in game["actions"]]
            final = [self._encode(f"{reasoning}\n\n\\boxed{{{action}}}") for action in game["final"]]
            self._replies[name] = (make, final)
        self._designer_marker = DESIGNER_SYSTEM[:60]
        self._hint_marker = HINT_SYSTEM[:60]

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + (self.eos_id,)

    def _reasoning(self, target: int) -> str:
        """About ``target`` tokens of reasoning text (REASONING repeated and cut at a word)."""
        words = (REASONING * (1 + target // 40)).split()
        lo, hi = 1, len(words)
        while lo < hi:  # the most words whose encoding is at most `target` tokens
            mid = (lo + hi + 1) // 2
            if len(self.tokenizer(" ".join(words[:mid]), add_special_tokens=False)["input_ids"]) <= target:
                lo = mid
            else:
                hi = mid - 1
        return " ".join(words[:lo])

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        started = time.perf_counter()
        result = self._reply(request)
        self.counts.seconds += time.perf_counter() - started
        await asyncio.sleep(0)  # a real engine answers later: let the other episodes run
        return result

    def _reply(self, request: GenerationRequest) -> GenerationResult:
        head = self.tokenizer.decode(list(request.prompt_ids[:400]), skip_special_tokens=False)
        if self._designer_marker in head:
            role = "designer"
            ids = self._designer[self._designer_calls % len(self._designer)]
            self._designer_calls += 1
        elif self._hint_marker in head:
            role, ids = "hint", self._hint
        else:
            role = "agent"
            game = next((name for name, g in GAMES.items() if g["marker"] in head), "unknown")
            self.counts.games[game] += 1
            rng = random.Random(request.sampling.seed)
            informative, final = self._replies[game]
            ids = rng.choice(final if final and rng.random() < self.final_rate else informative)
        finish = "stop"
        if len(ids) > request.sampling.max_new_tokens:
            ids, finish = ids[:request.sampling.max_new_tokens], "length"
        counts = self.counts.roles[role]
        counts.calls += 1
        counts.prompt_tokens += len(request.prompt_ids)
        counts.generated_tokens += len(ids)
        return GenerationResult(ids, (-1.0,) * len(ids), finish, 0)

    async def update_weights(self, named_tensors, version: int) -> None:  # pragma: no cover - not used
        raise NotImplementedError("the replay engine has no weights")

    def close(self) -> None:
        self._closed = True


# --------------------------------------------------------------------------- tokenizer


def load_tokenizer() -> tuple[Any, str]:
    try:
        from transformers import AutoTokenizer

        from spade.models.embedded import embedded_model_dir

        directory = embedded_model_dir()
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        name = f"SmolLM2-135M-Instruct ({directory})"
    except Exception as exc:  # noqa: BLE001 - any reason the embedded model is missing
        sys.path.insert(0, str(REPO_ROOT / "tests"))
        from chat_templates import bpe_tokenizer

        tokenizer = bpe_tokenizer()
        name = f"tests' byte-level BPE ChatML tokenizer (embedded model unavailable: {exc})"
    tokenizer.model_max_length = 1 << 30  # the designer prompts exceed SmolLM2's 8k; only token counts matter
    return tokenizer, name


# --------------------------------------------------------------------------- measuring


@dataclass
class StepFigures:
    step: int
    regeneration: bool
    wall_s: float
    engine_replay_s: float
    designer_s: float
    play_s: float
    rest_s: float
    episodes: int
    agent_turns: int
    turns_mean_nohint: float
    admitted: int
    agent_samples: int
    designer_samples: int
    generated_tokens: dict[str, int]
    prompt_tokens: dict[str, int]
    calls: dict[str, int]
    train_tokens: int
    return_mean: float
    win_rate: float
    games: dict[str, int]
    overhead_s: float = 0.0
    engine_est_s: float = 0.0
    train_est_s: float = 0.0
    share: float = 0.0
    overhead_ms_per_turn: float = 0.0

    def estimate(self, engine_rate: float, train_rate: float) -> None:
        self.overhead_s = self.wall_s - self.engine_replay_s
        self.engine_est_s = sum(self.generated_tokens.values()) / engine_rate
        self.train_est_s = self.train_tokens / train_rate
        total = self.overhead_s + self.engine_est_s + self.train_est_s
        self.share = self.overhead_s / total if total > 0 else 0.0
        self.overhead_ms_per_turn = 1000.0 * self.overhead_s / max(1, self.agent_turns)


async def measured_step(orchestrator: Orchestrator, engine: ReplayEngine, step: int) -> StepFigures:
    engine.counts = EngineCounts()
    started = time.perf_counter()
    out: StepOutput = await orchestrator.run_step(Step(step))
    wall = time.perf_counter() - started
    m = out.metrics
    counts = engine.counts
    train_tokens = sum(len(trajectory.token_ids) for trajectory in out.samples)
    episodes = int(m.get("agent/episodes", 0) + m.get("agent/hint_episodes", 0))
    designer_s, play_s = m["time/designer_s"], m["time/play_s"]
    return StepFigures(
        step=step, regeneration=Step(step).regenerates(orchestrator.settings.k), wall_s=wall, engine_replay_s=counts.seconds,
        designer_s=designer_s, play_s=play_s, rest_s=wall - designer_s - play_s, episodes=episodes,
        agent_turns=counts.roles["agent"].calls, turns_mean_nohint=m.get("agent/turns_mean", 0.0),
        admitted=int(len(orchestrator.envs)), agent_samples=len(out.agent_samples),
        designer_samples=len(out.designer_samples),
        generated_tokens={r: c.generated_tokens for r, c in counts.roles.items()},
        prompt_tokens={r: c.prompt_tokens for r, c in counts.roles.items()},
        calls={r: c.calls for r, c in counts.roles.items()}, train_tokens=train_tokens,
        return_mean=m.get("agent/return_mean", 0.0), win_rate=m.get("agent/win_rate", 0.0),
        games=dict(counts.games))


async def run(args: argparse.Namespace, settings: SelfPlaySettings, tokenizer: Any) -> tuple[list[StepFigures], dict]:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = ReplayEngine(tokenizer, eos_id=eos, reply_tokens=args.reply_tokens, final_rate=args.final_rate)
    corpus = None
    if not args.no_corpus and DEMO_CORPUS.is_file():
        corpus = Corpus(CorpusSettings.for_domain("games", (str(DEMO_CORPUS),)))
    sandbox_config = SandboxConfig(isolation=args.isolation)
    started = time.perf_counter()
    service = await SandboxService.start(sandbox_config)
    sandbox_start_s = time.perf_counter() - started
    figures: list[StepFigures] = []
    try:
        with tempfile.TemporaryDirectory(prefix="spade-step-overhead-") as tmp:
            run_dir = Path(tmp)
            orchestrator = Orchestrator(settings, sandbox=service, engine=engine, tokenizer=tokenizer, corpus=corpus,
                                        memory=Memory(run_dir / "memory.sqlite", settings.memory_capacity),
                                        run_dir=run_dir, seed=args.seed)
            for step in range(args.steps):
                figures.append(await measured_step(orchestrator, engine, step))
    finally:
        engine.close()
        await service.close()
    context = {"sandbox_start_s": sandbox_start_s, "sandbox_pool_size": sandbox_config.pool_size,
               "isolation": sandbox_config.isolation, "corpus": None if corpus is None else str(DEMO_CORPUS)}
    return figures, context


def window(figures: list[StepFigures], k: int) -> dict[str, float]:
    """One regeneration window: the regeneration step + (k - 1) ordinary steps costed like the
    mean measured ordinary step (or like the regeneration step's plays if none was measured)."""
    regen = [f for f in figures if f.regeneration]
    ordinary = [f for f in figures if not f.regeneration]
    if not regen or not ordinary:
        return {}

    def mean(attr: str) -> float:
        return sum(getattr(f, attr) for f in ordinary) / len(ordinary)

    r = regen[0]
    overhead = r.overhead_s + (k - 1) * mean("overhead_s")
    engine = r.engine_est_s + (k - 1) * mean("engine_est_s")
    train = r.train_est_s + (k - 1) * mean("train_est_s")
    turns = r.agent_turns + (k - 1) * mean("agent_turns")
    return {"k": k, "overhead_s": overhead, "engine_est_s": engine, "train_est_s": train,
            "share": overhead / (overhead + engine + train),
            "overhead_ms_per_turn": 1000.0 * overhead / max(1.0, turns)}


# --------------------------------------------------------------------------- report


def report(args: argparse.Namespace, settings: SelfPlaySettings, tokenizer_name: str, context: dict,
           figures: list[StepFigures], win: dict[str, float], total_s: float) -> tuple[str, bool]:
    lines = []
    add = lines.append
    add(f"command: {shlex.join([sys.executable] + sys.argv)}")
    add(f"machine: {platform.node()} / {os.cpu_count()} CPUs / Python {platform.python_version()}")
    add(f"tokenizer: {tokenizer_name}")
    add(f"settings: envs_per_set={settings.envs_per_set} g_nohint={settings.g_nohint} g_hint={settings.g_hint} "
        f"max_turns={settings.max_turns} k={settings.k} plays.max_concurrent={settings.plays.max_concurrent} "
        f"(scale {args.scale:g})")
    add(f"sandbox: {context['isolation']}, pool_size={context['sandbox_pool_size']} (started in "
        f"{context['sandbox_start_s']:.2f} s, not counted); corpus: {context['corpus']}")
    add(f"replay engine: agent replies ~{args.reply_tokens} reasoning tokens + a boxed action, final-answer rate "
        f"{args.final_rate:g}; engine time here is replay bookkeeping only (no model compute)")
    add(f"assumed rates: engine {args.engine_tokens_per_s:,.0f} generated tokens/s (prefill not counted), "
        f"train {args.train_tokens_per_s:,.0f} sample tokens/s")
    add("")
    for f in figures:
        kind = "regeneration" if f.regeneration else "ordinary"
        add(f"step {f.step} ({kind}):")
        add(f"  wall {f.wall_s:.2f} s = designer+admission+hints {f.designer_s:.2f} s + plays {f.play_s:.2f} s "
            f"+ samples/rewards/memory {f.rest_s:.2f} s; inside replay engine {f.engine_replay_s:.2f} s")
        add(f"  overhead (wall - replay engine) {f.overhead_s:.2f} s = {f.overhead_ms_per_turn:.3f} ms per "
            f"episode-turn")
        add(f"  episodes {f.episodes} (admitted envs {f.admitted}), agent turns {f.agent_turns} "
            f"({f.agent_turns / max(1, f.episodes):.2f} per episode; no-hint mean {f.turns_mean_nohint:.2f}), "
            f"no-hint return mean {f.return_mean:.3f}, win rate {f.win_rate:.3f}")
        add(f"  engine calls {f.calls}; generated tokens {f.generated_tokens} "
            f"(total {sum(f.generated_tokens.values()):,}); prompt tokens sent {sum(f.prompt_tokens.values()):,}")
        add(f"  samples: agent {f.agent_samples}, designer {f.designer_samples}; training tokens {f.train_tokens:,}")
        add(f"  estimated real step: engine {f.engine_est_s:.1f} s + train {f.train_est_s:.1f} s + overhead "
            f"{f.overhead_s:.2f} s -> overhead share {100 * f.share:.2f} %")
    add("")
    if win:
        share = win["share"]
        add(f"regeneration window (1 regeneration + {win['k'] - 1} ordinary steps): "
            f"overhead {win['overhead_s']:.1f} s, engine {win['engine_est_s']:.1f} s, "
            f"train {win['train_est_s']:.1f} s, {win['overhead_ms_per_turn']:.3f} ms overhead per episode-turn")
        add(f"PRIMARY: overhead share = overhead / (overhead + engine + train) = {100 * share:.2f} % over the window "
            f"(worst single step {100 * max(f.share for f in figures):.2f} %)")
    else:
        share = max(f.share for f in figures)
        add(f"PRIMARY: overhead share (worst measured step) = {100 * share:.2f} %")
    passed = share < TARGET_SHARE
    add(f"target: overhead share < {100 * TARGET_SHARE:.0f} % at the stated rates: {'PASS' if passed else 'FAIL'}")
    add(f"benchmark run time: {total_s:.1f} s")
    return "\n".join(lines), passed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="shrink environments per set and plays per arm by this factor (1 = paper size)")
    parser.add_argument("--envs-per-set", type=int, default=24)
    parser.add_argument("--g-nohint", type=int, default=16)
    parser.add_argument("--g-hint", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=25)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="steps to run from step 0 (default: 0 and 1)")
    parser.add_argument("--reply-tokens", type=int, default=60, help="reasoning tokens per agent reply")
    parser.add_argument("--final-rate", type=float, default=0.0,
                        help="probability that an agent turn gives a final answer (mostly wrong: ends the episode)")
    parser.add_argument("--engine-tokens-per-s", type=float, default=20_000.0)
    parser.add_argument("--train-tokens-per-s", type=float, default=10_000.0)
    parser.add_argument("--isolation", choices=("bubblewrap", "unsafe-local"), default="bubblewrap")
    parser.add_argument("--no-corpus", action="store_true", help="designer prompts without a corpus document")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", metavar="PATH", nargs="?", const="-",
                        help="also write the figures as JSON (to PATH, or stdout with no PATH)")
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        parser.error("--scale must be in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()

    def scaled(n: int) -> int:
        return max(1, round(n * args.scale))

    settings = SelfPlaySettings(envs_per_set=scaled(args.envs_per_set), g_nohint=scaled(args.g_nohint),
                                g_hint=scaled(args.g_hint) if args.g_hint else 0, max_turns=args.max_turns,
                                k=args.k)
    tokenizer, tokenizer_name = load_tokenizer()
    figures, context = asyncio.run(run(args, settings, tokenizer))
    for f in figures:
        f.estimate(args.engine_tokens_per_s, args.train_tokens_per_s)
    win = window(figures, settings.k)
    total_s = time.perf_counter() - began
    text, passed = report(args, settings, tokenizer_name, context, figures, win, total_s)
    print(text, flush=True)
    if args.json:
        data = {"command": shlex.join([sys.executable] + sys.argv), "tokenizer": tokenizer_name,
                "settings": {"envs_per_set": settings.envs_per_set, "g_nohint": settings.g_nohint,
                             "g_hint": settings.g_hint, "max_turns": settings.max_turns, "k": settings.k,
                             "max_concurrent_episodes": settings.plays.max_concurrent, "scale": args.scale},
                "rates": {"engine_tokens_per_s": args.engine_tokens_per_s,
                          "train_tokens_per_s": args.train_tokens_per_s},
                "context": context, "steps": [f.__dict__ for f in figures], "window": win,
                "target_share": TARGET_SHARE, "pass": passed, "run_s": total_s}
        payload = json.dumps(data, indent=1)
        if args.json == "-":
            print(payload)
        else:
            Path(args.json).write_text(payload + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
