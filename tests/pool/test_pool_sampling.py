"""The fixed pool's draws. By default as the released trainer draws (``selfplay.pool.draw: shuffle``):
one seeded shuffle of the sorted names per pass, the next sets taken in that order, a fresh shuffle
when a pass runs out. The variant ``balanced`` (skills balanced by slot as in a SPADE set). Both
resume exactly from the checkpointed state; a set admitted from a real sandbox; the baseline
recipe refuses to start without a pool."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from spade.designer.skills import GAME_SKILLS, SkillSettings
from spade.config import ConfigError
from spade.envs.pool_files import append_manifest, read_manifest
from spade.selfplay.sources.fixed_pool import FixedPool, read_pool
from spade.selfplay.sources.pool_settings import PoolSettings
from spade.selfplay.settings import AdmissionSettings, SamplingSettings, SelfPlaySettings
from spade.selfplay.step import Step

ROOT = Path(__file__).resolve().parents[2]
SKILLS = [skill.name for skill in GAME_SKILLS]
EXAMPLES = {  # the example environments and the skill each was written for (examples/envs/README.md)
    "remainder_oracle": "Mathematical Reasoning", "liars_island": "Logical Deduction",
    "foggy_grid": "Spatial Reasoning", "hidden_sequence": "Pattern Recognition",
    "crate_loading": "Optimization", "switchboard": "Causal Inference",
}
TRIVIAL = '''
class Trivial{n}Env:
    def reset(self, seed=None):
        return "Say anything.", {{}}

    def step(self, action):
        return "done", 1.0, True, False, {{}}
'''


def write_pool(directory: Path, skills: list[str | None], *, manifest: bool = True) -> list[str]:
    """A pool of ``len(skills)`` trivial environments ``env_00..``; skill None: no manifest line."""
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    for i, skill in enumerate(skills):
        name = f"env_{i:02d}"
        (directory / f"{name}.py").write_text(TRIVIAL.format(n=i))
        if manifest and skill is not None:
            append_manifest(directory, {"name": name, "skill": skill})
        names.append(name)
    return names


BALANCED = PoolSettings(draw="balanced", seed=None)  # the variant, seeded from the run seed


def pool(directory: Path, seed: int = 5, **overrides) -> FixedPool:
    """The skill-balanced variant (most tests below); ``pool=PoolSettings()`` for the released draw."""
    values = dict(envs_per_set=4, k=2, env_source="fixed_pool", fixed_env_dir=str(directory), pool=BALANCED)
    values.update(overrides)
    return FixedPool(SelfPlaySettings(**values), sandbox=None, run_dir=directory.parent / "run", seed=seed)


def released_sets(names: list[str], per_set: int, n_sets: int, seed: int) -> list[list[str]]:
    """The released trainer's rule, written out (spade-rl/spade, spade/slime/spade_rollout.py,
    _select_static_games_without_replacement): one Random(seed) shuffles the sorted names; each set is
    the next per_set of that order; when fewer are left, they are taken, the same Random shuffles the
    whole pool afresh, the ones just taken are struck from it, and the set is filled from its front."""
    rng = random.Random(seed)
    everything = sorted(names)
    left = list(everything)
    rng.shuffle(left)
    sets = []
    for _ in range(n_sets):
        chosen, left = left[:per_set], left[per_set:]
        if len(chosen) < per_set:
            fresh = list(everything)
            rng.shuffle(fresh)
            fresh = [name for name in fresh if name not in chosen]
            need = per_set - len(chosen)
            chosen, left = chosen + fresh[:need], fresh[need:]
        sets.append(chosen)
    return sets


@pytest.mark.parametrize("size, per_set", [(10, 4), (8, 4), (3, 4), (30, 24), (7, 7)])
def test_the_default_draw_is_the_released_seeded_shuffle(tmp_path, size, per_set):
    skills = [SKILLS[i % 6] for i in range(size)]
    names = write_pool(tmp_path / "pool", skills)
    settings = SelfPlaySettings(envs_per_set=per_set, k=1, env_source="fixed_pool", fixed_env_dir=str(tmp_path / "pool"))
    assert settings.pool == PoolSettings(draw="shuffle", seed=42)  # --spade-fixed-pool-seed's default
    source = FixedPool(settings, sandbox=None, run_dir=tmp_path / "run", seed=1234)  # the run seed plays no part
    drawn = [source.draw(step) for step in range(9)]
    assert [names_of(d) for d in drawn] == released_sets(names, per_set, 9, seed=42)
    # the manifest's skill labels each draw; no slot asks for a skill, so nothing falls back
    assert all(d.skill == skills[names.index(d.entry.name)] and not d.fallback for s in drawn for d in s)


def test_the_released_draw_without_a_manifest_and_under_another_seed(tmp_path):
    names = write_pool(tmp_path / "pool", [None] * 10, manifest=False)
    settings = SelfPlaySettings(envs_per_set=4, k=1, env_source="fixed_pool", fixed_env_dir=str(tmp_path / "pool"),
                                pool=PoolSettings(seed=7))
    source = FixedPool(settings, sandbox=None, run_dir=tmp_path / "run", seed=0)
    drawn = [source.draw(step) for step in range(6)]
    assert [names_of(d) for d in drawn] == released_sets(names, 4, 6, seed=7)
    assert {d.skill for s in drawn for d in s} == {"unknown"}  # as the released trainer labels them
    # null: the run seed
    follows = FixedPool(SelfPlaySettings(envs_per_set=4, k=1, env_source="fixed_pool",
                                         fixed_env_dir=str(tmp_path / "pool"), pool=PoolSettings(seed=None)),
                        sandbox=None, run_dir=tmp_path / "run2", seed=7)
    assert [names_of(follows.draw(step)) for step in range(6)] == released_sets(names, 4, 6, seed=7)


@pytest.mark.parametrize("stop", [1, 2, 3, 5])
def test_the_released_draw_resumes_exactly(tmp_path, stop):
    names = write_pool(tmp_path / "pool", [SKILLS[i % 6] for i in range(10)])
    settings = SelfPlaySettings(envs_per_set=4, k=1, env_source="fixed_pool", fixed_env_dir=str(tmp_path / "pool"))
    first = FixedPool(settings, sandbox=None, run_dir=tmp_path / "a", seed=0)
    for step in range(stop):
        first.draw(step)
    state = json.loads(json.dumps(first.state_dict()))  # as the checkpoint stores it
    resumed = FixedPool(settings, sandbox=None, run_dir=tmp_path / "b", seed=0)
    resumed.load_state_dict(state)
    assert [names_of(resumed.draw(step)) for step in range(stop, 8)] == released_sets(names, 4, 8, seed=42)[stop:]
    # a checkpoint of the other draw is refused, naming the key
    other = FixedPool(dataclass_replace(settings, pool=BALANCED), sandbox=None, run_dir=tmp_path / "c", seed=0)
    with pytest.raises(ValueError, match="selfplay.pool.draw"):
        other.load_state_dict(state)


def dataclass_replace(settings, **changes):
    import dataclasses

    return dataclasses.replace(settings, **changes)


def names_of(draws) -> list[str]:
    return [d.entry.name for d in draws]


def test_without_replacement_pass_after_pass(tmp_path):
    names = write_pool(tmp_path / "pool", [None] * 10, manifest=False)
    source = pool(tmp_path / "pool")
    sets = [names_of(source.draw(step)) for step in range(0, 2 * 10, 2)]  # 10 regenerations of 4: 4 passes
    assert all(len(s) == len(set(s)) == 4 for s in sets)  # never a repeat within a set
    flat = [name for s in sets for name in s]
    # passes are the consecutive runs of 10 draws: each environment exactly once in each of them
    for p in range(4):
        assert sorted(flat[10 * p:10 * (p + 1)]) == names
    # the passes are shuffled, and differently from one another
    assert flat[:10] != names and flat[:10] != flat[10:20]
    assert source.sampler.pass_number == 3 and len(source.sampler.drawn) == 10


def test_a_set_that_crosses_into_a_new_pass_repeats_nothing(tmp_path):
    write_pool(tmp_path / "pool", [None] * 5, manifest=False)
    source = pool(tmp_path / "pool")  # sets of 4 from 5: the second set takes 1 from pass 0, 3 from pass 1
    first, second, third = (names_of(source.draw(step)) for step in (0, 2, 4))
    names = read_names(tmp_path / "pool")
    assert len(set(first)) == len(set(second)) == len(set(third)) == 4
    assert second[0] == (set(names) - set(first)).pop()  # the last one of pass 0
    assert sorted(second[1:] + third[:2]) == names  # pass 1: the whole pool once, its leftover included
    assert source.sampler.pass_number == 2 and source.sampler.drawn == third[2:]


def read_names(directory: Path) -> list[str]:
    return [entry.name for entry in read_pool(directory)]


def test_skills_are_balanced_by_slot_with_a_manifest(tmp_path):
    # 4 environments of each of the six skills; the games curriculum with a window of 2 and sets of 4:
    # slots want [a, b, a, b] for the active pair, and the pair moves by 2 every regeneration (k = 2)
    skills = [SKILLS[i % 6] for i in range(24)]
    write_pool(tmp_path / "pool", skills)
    source = pool(tmp_path / "pool", skills=SkillSettings(window=2))
    draws = [source.draw(step) for step in range(0, 12, 2)]  # 6 regenerations: 24 draws, one pass
    for r, set_draws in enumerate(draws):
        active = [SKILLS[(2 * r + j) % 6] for j in range(2)]
        assert [d.wanted for d in set_draws] == [active[0], active[1], active[0], active[1]]
        assert [d.skill for d in set_draws] == [d.wanted for d in set_draws]  # every slot got its skill
        assert not any(d.fallback for d in set_draws)
    assert sorted(name for s in draws for name in names_of(s)) == read_names(tmp_path / "pool")


def test_a_skill_the_pass_has_run_out_of_falls_back_and_is_counted(tmp_path):
    # one Mathematical Reasoning environment, seven others: sets of 4 all wanting Mathematical Reasoning
    write_pool(tmp_path / "pool", ["Mathematical Reasoning"] + ["Optimization"] * 7)
    source = pool(tmp_path / "pool", skills=SkillSettings(skills=("Mathematical Reasoning",), window=1))
    first = source.draw(0)
    assert first[0].entry.name == "env_00" and not first[0].fallback and first[0].skill == "Mathematical Reasoning"
    assert [d.fallback for d in first[1:]] == [True] * 3
    assert all(d.skill == "Optimization" and d.wanted == "Mathematical Reasoning" for d in first[1:])
    second = source.draw(2)  # the rest of pass 0: four Optimization environments, all fallbacks
    assert [d.fallback for d in second] == [True] * 4 and "env_00" not in names_of(second)
    third = source.draw(4)  # pass 1: the Mathematical Reasoning environment comes first again
    assert third[0].entry.name == "env_00" and not third[0].fallback


def test_manifest_lines_without_a_file_and_files_without_a_line(tmp_path):
    directory = tmp_path / "pool"
    write_pool(directory, ["Optimization", "Optimization"])
    (directory / "env_02.py").write_text(TRIVIAL.format(n=2))  # no manifest line: skill unknown
    append_manifest(directory, {"name": "gone", "skill": "Optimization"})  # no gone.py
    with (directory / "pool.jsonl").open("a") as handle:
        handle.write('{"name": "env_03", "sk')  # an append cut short by a crash
    entries = read_pool(directory)
    assert [(e.name, e.skill) for e in entries] == [("env_00", "Optimization"), ("env_01", "Optimization"),
                                                   ("env_02", None)]
    append_manifest(directory, {"name": "env_02", "skill": "Causal Inference"})  # cuts the torn line off first
    assert [r["name"] for r in read_manifest(directory)] == ["env_00", "env_01", "gone", "env_02"]
    (directory / "pool.jsonl").write_text('{"name": "env_00"}\nnot json\n{"name": "env_01"}\n')
    with pytest.raises(ValueError, match="pool.jsonl:2"):
        read_manifest(directory)


def test_the_draw_state_resumes_exactly(tmp_path):
    write_pool(tmp_path / "pool", [SKILLS[i % 3] for i in range(11)])
    straight = pool(tmp_path / "pool")
    sets = [names_of(straight.draw(step)) for step in range(0, 16, 2)]
    first = pool(tmp_path / "pool")
    for step in range(0, 6, 2):
        first.draw(step)
    state = json.loads(json.dumps(first.state_dict()))  # as the checkpoint stores it
    resumed = pool(tmp_path / "pool")
    resumed.load_state_dict(state)
    assert [names_of(resumed.draw(step)) for step in range(6, 16, 2)] == sets[3:]
    assert resumed.state_dict() == straight.state_dict()
    # another seed draws other sets; a checkpoint from before sampling (empty state) starts afresh
    assert [names_of(pool(tmp_path / "pool", seed=6).draw(s)) for s in (0, 2)] != sets[:2]
    fresh = pool(tmp_path / "pool")
    fresh.load_state_dict({})
    assert names_of(fresh.draw(0)) == sets[0]
    # the pool changed under the run: refused with the key named
    (tmp_path / "pool" / "env_99.py").write_text(TRIVIAL.format(n=99))
    with pytest.raises(ValueError, match="selfplay.fixed_env_dir.*changed"):
        pool(tmp_path / "pool").load_state_dict(state)


def test_a_pool_no_larger_than_the_set_is_played_whole_in_name_order(tmp_path):
    names = write_pool(tmp_path / "pool", [None] * 3, manifest=False)
    source = pool(tmp_path / "pool", envs_per_set=3, skills=SkillSettings(window=3))
    for step, skills in ((0, SKILLS[:3]), (2, SKILLS[3:]), (4, SKILLS[:3])):  # the window moves by 3
        draws = source.draw(step)
        assert names_of(draws) == names and [d.skill for d in draws] == skills  # skills by slot


def test_a_drawn_set_is_admitted_saved_and_recorded(sandbox, tmp_path):
    directory = tmp_path / "pool"
    directory.mkdir()
    for name, skill in EXAMPLES.items():
        shutil.copy(ROOT / "examples" / "envs" / f"{name}.py", directory / f"{name}.py")
        append_manifest(directory, {"name": name, "skill": skill})
    (directory / "switchboard.hint.txt").write_text("Flip one switch at a time.\n")
    (directory / "broken.py").write_text("class BrokenEnv(:\n")
    append_manifest(directory, {"name": "broken", "skill": "Causal Inference"})
    settings = SelfPlaySettings(envs_per_set=3, k=1, env_source="fixed_pool", fixed_env_dir=str(directory),
                                skills=SkillSettings(window=3), max_turns=5, pool=BALANCED)
    run = tmp_path / "run"
    source = FixedPool(settings, sandbox=sandbox.service, run_dir=run, seed=0)
    first, second, third = (sandbox.run(source.next_set(step), timeout=120) for step in (0, 1, 2))
    # step 0 wants skills 0..2: three different examples, in slot order
    assert [e.env_id for e in first.envs] == ["fixed-remainder_oracle", "fixed-liars_island", "fixed-foggy_grid"]
    assert [e.skill for e in first.envs] == SKILLS[:3] and not first.rejections
    # step 1 wants skills 3..5; two Causal Inference candidates compete for slot 2 and under seed 0
    # the pass reaches the broken one first: rejected with its reason, the slot stays empty
    record = json.loads((run / "pool_draws" / "step_000001.json").read_text())
    assert [d["wanted"] for d in record["draws"]] == SKILLS[3:] and record["fallbacks"] == 0
    assert [d["name"] for d in record["draws"]] == ["hidden_sequence", "crate_loading", "broken"]
    assert [e.env_id for e in second.envs] == ["fixed-hidden_sequence", "fixed-crate_loading"]
    assert [(r.slot, r.kind.value) for r in second.rejections] == [(2, "syntax_error")]
    assert (run / "rejected" / "step_000001" / "slot2_attempt0.json").is_file()
    # step 2 wants skills 0..2 again: pass 0 has only switchboard left (a fallback, with its hint),
    # then pass 1 starts and gives the slots their skills
    record = json.loads((run / "pool_draws" / "step_000002.json").read_text())
    assert [(d["name"], d["fallback"], d["pass"]) for d in record["draws"]] == [
        ("switchboard", True, 0), ("liars_island", False, 1), ("foggy_grid", False, 1)]
    assert record["fallbacks"] == 1 and record["pass"] == 1
    source.observe(2, third.envs, {})  # the orchestrator asks for the metrics after each step's plays
    assert source.metrics() == {"pool/fallbacks": 1.0, "pool/pass": 1.0, "pool/drawn_in_pass": 2.0, "pool/size": 7.0}
    source.observe(3, third.envs, {})  # not a regeneration step: nothing drawn, nothing reported
    assert source.metrics() == {}
    assert [(e.env_id, e.skill) for e in third.envs] == [("fixed-switchboard", "Causal Inference"),
                                                         ("fixed-liars_island", SKILLS[1]),
                                                         ("fixed-foggy_grid", SKILLS[2])]
    assert third.envs[0].hint == "Flip one switch at a time."
    saved = sorted(p.name for p in (run / "envs" / "step_000000").iterdir())
    assert saved == sorted(f"fixed-{n}{ext}" for n in ("remainder_oracle", "liars_island", "foggy_grid")
                           for ext in (".py", ".hint.txt", ".json"))
    assert json.loads((run / "envs" / "step_000000" / "fixed-foggy_grid.json").read_text())["class_name"] == "FoggyGridEnv"


def test_the_baseline_recipe_draws_24_environments_every_step_actor_only():
    from spade.train_config import load_train_config

    config = load_train_config(ROOT / "examples" / "recipes" / "baseline_fixed_pool.yaml", [])
    sp = config.selfplay
    assert (sp.env_source, sp.envs_per_set, sp.k, sp.g_hint) == ("fixed_pool", 24, 1, 0)
    assert not (sp.designer_enabled or sp.train_designer or sp.use_corpus or sp.use_memory)
    assert sp.pool.draw == "shuffle" and sp.pool.seed == 42  # _train_fixed_gpt55.sh: --spade-no-replacement, seed 42
    # the released loader binds its standard-library names in every game (synthetic_game_env.py)
    assert sp.pool.released_loader_names is True
    assert PoolSettings().released_loader_names is False  # designed environments import what they use
    assert Path(sp.fixed_env_dir) != ROOT / "examples" / "envs"  # never the six example games by default


def test_the_baseline_recipe_refuses_to_start_without_a_pool(tmp_path):
    from spade.run.preflight import preflight
    from spade.run.run_dir import RunDirError
    from spade.train_config import load_train_config

    recipe = ROOT / "examples" / "recipes" / "baseline_fixed_pool.yaml"
    config = load_train_config(recipe, ["model.hf_dir=embedded"])
    assert not Path(config.selfplay.fixed_env_dir).exists()
    with pytest.raises(RunDirError) as refused:
        preflight(config)
    message = str(refused.value)
    for needed in ("selfplay.fixed_env_dir=", "spade pool import", "spade pool generate", "spade pool assemble"):
        assert needed in message, message
    # the same words when the source is built directly (no preflight in between)
    with pytest.raises(ConfigError, match="spade pool import"):
        FixedPool(config.selfplay, sandbox=None, run_dir=tmp_path / "run", seed=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunDirError, match="spade pool import"):
        preflight(load_train_config(recipe, ["model.hf_dir=embedded", f"selfplay.fixed_env_dir={empty}"]))
    # the example games, asked for by name (a smoke test), are accepted
    preflight(load_train_config(recipe, ["model.hf_dir=embedded", "selfplay.fixed_env_dir=examples/envs"]))


def test_the_orchestrator_checkpoints_the_draw_and_a_resume_draws_the_same_sets(sandbox, tmp_path):
    """Through the orchestrator's own state (what the trainer checkpoints): a run resumed after
    step 1 plays the sets the straight run played at steps 2 and 3."""
    from chat_templates import bpe_tokenizer
    from spade.rollout import HFEngine
    from spade.selfplay.orchestrator import Orchestrator
    from support.models import tiny_qwen3

    directory = tmp_path / "pool"
    write_pool(directory, [SKILLS[i % 2] for i in range(5)])
    tokenizer = bpe_tokenizer()
    model = tiny_qwen3(tokenizer, size="1x32", max_position_embeddings=4096)
    engine = HFEngine((model, tokenizer), eos_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    settings = SelfPlaySettings(envs_per_set=2, k=1, g_nohint=1, g_hint=0, max_turns=1,
                                sampling=SamplingSettings().replace(agent={"max_tokens": 4}),
                                max_context_tokens=4096, env_source="fixed_pool", fixed_env_dir=str(directory),
                                use_corpus=False, use_memory=False, train_designer=False,
                                admission=AdmissionSettings(probes=False),  # the trivial pool games pay any reply
                                skills=SkillSettings(skills=tuple(SKILLS[:2]), window=2))

    def orchestrator(run: str) -> Orchestrator:
        return Orchestrator(settings, sandbox=sandbox.service, engine=engine, tokenizer=tokenizer, corpus=None,
                            memory=None, run_dir=tmp_path / run, seed=11)

    def played(orch: Orchestrator, step: int) -> list[str]:
        out = sandbox.run(orch.run_step(Step(step)), timeout=120)
        assert out.metrics["pool/size"] == 5.0 and out.metrics["pool/fallbacks"] == 0.0
        return [env.env_id for env in orch.envs]

    try:
        straight = orchestrator("straight")
        sets = [played(straight, step) for step in range(4)]
        first = orchestrator("first")
        for step in range(2):
            played(first, step)
        state = json.loads(json.dumps(first.state_dict()))
        resumed = orchestrator("resumed")
        resumed.load_state_dict(state)
        assert [played(resumed, step) for step in (2, 3)] == sets[2:]
    finally:
        engine.close()
    flat = [env_id for s in sets for env_id in s]
    assert sorted(flat[:5]) == [f"fixed-env_{i:02d}" for i in range(5)]  # the first pass: every one once
    assert all(len(set(s)) == 2 for s in sets)
    # the released draw's state: one pass of 5 by sets of 2 taken to its 4th name, nothing carried over
    assert (state["env_source"]["draw"], state["env_source"]["pass"], state["env_source"]["taken"],
            state["env_source"]["carried"]) == ("shuffle", 0, 4, [])
