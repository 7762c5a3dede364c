"""The reproduction recipes (examples/recipes/paper/, issue 39) hold the released runs' settings.

``RELEASED`` is the table: for each paper recipe, ``{config key: (released value, citation)}``.
A citation is ``"<file>:<line>[-<line>] <text>"``: a file of the released code (GitHub
``spade-rl/spade`` at ``RELEASED_COMMIT``), the line (or lines) that set the value, and the text
those lines hold. Every recipe is loaded with spade's own config loader and every key compared;
a failure names the key and the citation. Where a copy of the released repository is at hand
(``SPADE_RELEASED_REPO``, a git directory, or the mirror below), the cited lines are read and must
hold the cited text, so a wrong line number fails too.

``SPADE_CHOICES`` holds spade's own recipes (examples/recipes/*.yaml) to the values spade judges
better for the switches where the two families differ, so a change to one family cannot make it
drift into the other.
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from spade.train_config import load_train_config, read_config_file

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "examples" / "recipes" / "paper"
OWN = ROOT / "examples" / "recipes"
RELEASED_COMMIT = "9b2b813"
MIRROR = Path(os.environ.get("SPADE_RELEASED_REPO", "/work/.mirror/spade-rl+spade/repo"))

G4 = "cmd/games/train_spade_4b.sh"
G8 = "cmd/games/train_spade_8b.sh"
G30 = "cmd/games/train_spade_30b.sh"
TB = "cmd/tool_use/_train_spade_blend.sh"
T4 = "cmd/tool_use/train_spade_4b.sh"
F = "cmd/games/_train_fixed_gpt55.sh"
ARGS = "spade/slime/arguments.py"
ROLLOUT = "spade/slime/spade_rollout.py"
ORCH = "spade/core/orchestrator.py"
CUDA_GRAPH_BS = [1, 2, 4, 8, *range(16, 257, 8)]  # $(seq 16 8 256)
# the rescale of a short batch to its real count, skipped with the KL term on (then slime divides by
# --global-batch-size): loss.sample_mean_denominator
KL_RESCALE = f"{ROLLOUT}:846-849 and args.kl_loss_coef == 0.0"


def _released_code() -> dict:
    """Settings read in the released Python code (or slime's defaults), the same for every launcher."""
    return {
        "selfplay.max_attempts": (5, f"{ROLLOUT}:487 max_attempts=5"),
        "selfplay.sampling.designer.top_p": (0.95, f"{ARGS}:37-39 --spade-env-top-p"),
        "selfplay.sampling.designer.top_k": (20, f"{ARGS}:43-45 --spade-env-top-k"),
        "selfplay.sampling.agent.top_p": (0.95, f"{ARGS}:70-72 --spade-actor-top-p"),
        "selfplay.sampling.agent.top_k": (20, f"{ARGS}:76-78 --spade-actor-top-k"),
        "selfplay.sampling.designer.timeout_s": (300.0, "spade/core/corpus_orchestrator.py:129 timeout=300"),
        "selfplay.admission.timeout_s": (60.0, f"{ORCH}:86 VALIDATE_GAME_TIMEOUT = 60"),
        "selfplay.sampling.hint.timeout_s": (120.0, "spade/core/hint_generator.py:256 timeout=120"),
        "sandbox.load_timeout_s": (30.0, f"{ORCH}:27 ENV_STEP_TIMEOUT = 30"),
        "sandbox.reset_timeout_s": (30.0, f"{ORCH}:27 ENV_STEP_TIMEOUT = 30"),
        "sandbox.step_timeout_s": (30.0, f"{ORCH}:27 ENV_STEP_TIMEOUT = 30"),
        "selfplay.rewards.advantage_cap": (50.0, f"{ARGS}:245-247 --spade-max-env-reward-scale"),
        # admission: reset() and three unchecked actions, nothing else
        "selfplay.admission.paper_exact": (True, "spade/core/utils/game_files.py:11-23 def validate_game"),
        "selfplay.admission.determinism": (False, "spade/core/utils/game_files.py:11-23 def validate_game"),
        "selfplay.admission.probes": (False, "spade/core/utils/game_files.py:11-23 def validate_game"),
        "selfplay.admission.reference_policy": (False, "spade/core/utils/game_files.py:11-23 def validate_game"),
        "selfplay.admission.smoke_test": ("released", "spade/core/utils/game_files.py:11-23 def validate_game"),
        # the time bounds: a hinted reply, a no-hint play, the designer calls of a set
        "selfplay.plays.hint_turn_timeout_s": (300.0, f"{ORCH}:28 ACTOR_TURN_TIMEOUT = 300"),
        "selfplay.plays.nohint_play_timeout_s": (300.0, f"{ORCH}:1521 per_game_timeout = 300"),
        "selfplay.set_generation_timeout_s": (900.0, f"{ORCH}:1462 overall_timeout = 900"),
        "selfplay.memory_seed_dir": (None, "spade/core/env_memory.py:72-74 self.records"),
        "selfplay.hint_max_chars": (None, "spade/core/hint_generator.py:109-133"),
        "selfplay.partial_rollouts.enabled": (False, f"{ROLLOUT}:449-451 trajectories_per_game"),
        "selfplay.rollout_shards": (1, f"{ROLLOUT}:449-451 trajectories_per_game"),
        "run.overlap": (0, f"{ROLLOUT}:449-451 trajectories_per_game"),
        "run.seed": (1234, f"{G4}:227-245 ray job submit"),  # no --seed: slime's default 1234
    }


def _trainer(f: str, *, lr: int, eps: int, grpo: int, tp: int, size: str, sglang: int, mem: float, temp: int,
             logprob_t: float = 1.0) -> dict:
    """The trainer's flags of launcher ``f``: optimizer (``lr`` = the --lr line), loss (``eps`` = the
    --eps-clip line, ``grpo`` = the GRPO_ARGS line), Megatron layout (``tp`` = the tensor-parallel
    line), the colocated SGLang servers (``sglang`` = the --rollout-num-gpus-per-engine line) and
    the temperature slime takes the trainer's log-probs at (``temp`` = the --rollout-temperature line)."""
    table = {
        "optimizer.lr": (1.0e-6, f"{f}:{lr} --lr 1e-6"),
        "optimizer.schedule": ("constant", f"{f}:{lr + 1} --lr-decay-style constant"),
        "optimizer.weight_decay": (0.1, f"{f}:{lr + 2} --weight-decay 0.1"),
        "optimizer.betas": ((0.9, 0.98), f"{f}:{lr + 3}-{lr + 4} --adam-beta1 0.9"),
        "optimizer.clip_grad": (1.0, f"{f}:{lr - 1}-{lr + 4} --optimizer adam"),  # slime's default 1.0
        "optimizer.use_distributed_optimizer": (True, f"{f}:{lr - 1}-{lr + 4} --optimizer adam"),  # slime: always
        "optimizer.overlap_grad_reduce": (False, f"{f}:{lr - 1}-{lr + 4} --optimizer adam"),
        "loss.eps_low": (0.2, f"{f}:{eps} --eps-clip 0.2"),
        "loss.eps_high": (0.28, f"{f}:{eps + 1} --eps-clip-high 0.28"),
        "loss.tis_cap": (2.0, f"{f}:{eps + 2} --use-tis"),
        # no --calculate-per-token-loss: each sample's token mean, summed, / the step's samples
        "loss.aggregation": ("sample_mean", f"{f}:{grpo}-{eps + 2} --advantage-estimator grpo"),
        "loss.logprob_temperature": (logprob_t, f"{f}:{temp} --rollout-temperature {logprob_t}"),
        "loss.routing_replay": ("off", f"{f}:{grpo}-{eps + 2} --advantage-estimator grpo"),
        "model.recompute": ("full", f"{f}:{tp + 6} --recompute-granularity full"),
        "model.recompute_method": ("uniform", f"{f}:{tp + 7} --recompute-method uniform"),
        "model.recompute_num_layers": (1, f"{f}:{tp + 8} --recompute-num-layers 1"),
        "parallel.tp": (4 if size == "30b" else 2, f"{f}:{tp} --tensor-model-parallel-size {4 if size == '30b' else 2}"),
        "parallel.sequence_parallel": (True, f"{f}:{tp + 1} --sequence-parallel"),
        "parallel.pp": (1, f"{f}:{tp + 2} --pipeline-model-parallel-size 1"),
        "engine.kind": ("sglang", f"{f}:{sglang} --rollout-num-gpus-per-engine"),
        "engine.sglang.mem_fraction": (mem, f"{f}:{sglang + 1} --sglang-mem-fraction-static"),
    }
    if size == "30b":
        table.update({
            "parallel.ep": (8, f"{f}:{tp + 4} --expert-model-parallel-size 8"),
            "parallel.etp": (1, f"{f}:{tp + 5} --expert-tensor-parallel-size 1"),
            "engine.sglang.servers_per_node": (1, f"{f}:{sglang} --rollout-num-gpus-per-engine 8"),
            "engine.sglang.tp": (8, f"{f}:{sglang} --rollout-num-gpus-per-engine 8"),
            "engine.sglang.ep": (8, f"{f}:{sglang + 2} --sglang-ep-size 8"),
            "engine.sglang.server_args.cuda_graph_bs": (CUDA_GRAPH_BS, f"{f}:{sglang + 3} --sglang-cuda-graph-bs 1 2 4 8 $(seq 16 8 256)"),
            "engine.sglang.server_args.moe_runner_backend": ("triton", f"{f}:{sglang + 5} --sglang-moe-runner-backend triton"),
            "engine.sglang.server_args.disable_custom_all_reduce": (True, f"{f}:{sglang + 6} --sglang-disable-custom-all-reduce"),
        })
    else:
        table.update({
            "parallel.ep": (1, f"{f}:{tp}-{tp + 8} --tensor-model-parallel-size"),
            "engine.sglang.servers_per_node": (8, f"{f}:{sglang} --rollout-num-gpus-per-engine 1"),
            "engine.sglang.tp": (1, f"{f}:{sglang} --rollout-num-gpus-per-engine 1"),
            "engine.sglang.server_args": ({}, f"{f}:{sglang}-{sglang + 2} --sglang-tool-call-parser qwen"),
        })
    return table


def _switches(f: str, *, gbs: int, template: int, corpus_check: str, global_batch: int = 192) -> dict:
    """The issue-39 switches a designer launcher (``f``) sets to the released behaviour: ``gbs`` =
    its --global-batch-size line, ``template`` = its --spade-actor-template line, ``corpus_check`` =
    the lines that make it refuse to start without a corpus."""
    return {
        "selfplay.batch.nohint_plays": ("global_batch", f"{ORCH}:2382 math.ceil(global_batch_size / len(selected_game_files))"),
        "selfplay.batch.global_batch": (global_batch, f"{f}:{gbs} --global-batch-size {global_batch}"),
        "selfplay.batch.cut_to_global_batch": (True, f"{ROLLOUT}:836-838 grouped_samples[:global_batch_size]"),
        "selfplay.batch.release_at_final_step": (True, f"{ROLLOUT}:557-558 Flush at final rollout"),
        "selfplay.rewards.advantage_agent_samples": (None, f"{ROLLOUT}:597-603 num_actor_trajectories=len(actor_samples)"),
        "selfplay.rewards.failed_hint": ("hint_return_zero", "spade/core/utils/delayed_env_rewards.py:462 cached_hint_rewards.get(game_file, 0.0)"),
        "selfplay.hint_attempts": (3, "spade/core/hint_generator.py:265-287 generate_hint_with_retry"),
        # the hint call passes no top-p and no top-k: the adapter's 0.9, and no top-k
        "selfplay.sampling.hint.top_p": (0.9, "spade/slime/model_adapter.py:155 top_p: float = 0.9"),
        "selfplay.sampling.hint.top_k": (None, "spade/core/hint_generator.py:250-256 temperature=self.temperature"),
        "selfplay.hint_length": ("three_sentences", "spade/core/hint_generator.py:37 1-3 sentences (under 100 words)"),
        "selfplay.action_extraction": ("first_flat_box", "spade/core/utils/parsing.py:7-36 def extract_boxed_answer"),
        "selfplay.agent_game_prompt": ("paper", f"{f}:{template} --spade-actor-template qwen3_game"),
        "selfplay.designer_prompt_rules": ("released", "spade/core/prompts/corpus_template.py:18-96 INTERACTIVE_SPEC"),
        "selfplay.code_extraction": ("released", "spade/core/utils/parsing.py:111-113 def extract_game_code"),
        "selfplay.skills.descriptions": ("released", "spade/core/game_generator.py:42 Identifying patterns"),
        "selfplay.plays.reset_seeds": ("independent", f"{ORCH}:1950-1952 hash(game_file + \"0\") % (2**31)"),
        "selfplay.plays.env_faults": ("retry_then_drop", f"{ORCH}:1498 max_attempts: int = 2"),
        "selfplay.plays.hint_arm_budgets": ("released", f"{ORCH}:1861 for turn in range(self.config.max_turns)"),
        "selfplay.plays.tool_mask_scope": ("tool_call_block", f"{ORCH}:924-926 SPADE_MASK_MALFORMED_TOOLCALL"),
        "selfplay.plays.released_loader_names": (True, "spade/core/envs/synthetic_game_env.py:43 _COMMON_STDLIB_INJECTIONS"),
        "sandbox.offer_numpy": (True, "spade/core/envs/synthetic_game_env.py:43-104 \"np\": np"),
        "selfplay.admission.tool_use.schema_gate": (False, f"{ORCH}:1137-1138 validate_game_async"),
        "corpus.document_spacing": ("released", "spade/core/corpus.py:110-116 \" \".join(words[: self.max_doc_tokens])"),
        "corpus.require_real": (True, corpus_check),
        "eval.protocol": ("in_loop", "eval_configs/eval_aime_avg32.yaml:3-7 n_samples_per_eval_prompt: 32"),
    }


def _games(f: str, n: dict) -> dict:
    """A SPADE games launcher (``f``) with its line numbers ``n``."""
    return {
        **_released_code(),
        **_trainer(f, lr=n["lr"], eps=n["eps"], grpo=n["eps"] - 7, tp=n["tp"], size=n["size"], sglang=n["sglang"],
                   mem=0.7, temp=n["batch"] + 3),
        **_switches(f, gbs=n["batch"] + 4, template=n["template"] + 1, corpus_check=n["corpus_check"]),
        "selfplay.domain": ("games", f"{f}:{n['template']} qwen3_multiturn_game_generation"),
        "selfplay.k": (4, f"{f}:{n['regen']} --spade-game-regeneration-interval"),
        "selfplay.envs_per_set": (24, f"{f}:{n['batch']} --rollout-batch-size 24"),
        "selfplay.g_nohint": (8, f"{f}:{n['batch'] + 4} --global-batch-size 192"),
        "selfplay.g_hint": (16, f"{f}:{n['hint'] + 2} --spade-hint-plays-per-game 16"),
        "selfplay.sampling.designer.temperature": (0.6, f"{f}:{n['temp']} --spade-env-temperature 0.6"),
        "selfplay.sampling.agent.temperature": (0.6, f"{f}:{n['temp'] + 1} --spade-actor-temperature 0.6"),
        "selfplay.sampling.hint.temperature": (0.3, f"{f}:{n['hint']} --spade-hint-temperature 0.3"),
        "selfplay.sampling.hint.max_tokens": (4096, f"{f}:{n['hint'] + 1} --spade-hint-max-tokens 4096"),
        "selfplay.sampling.agent.max_tokens": (8192, f"{f}:{n['temp'] + 2} --spade-actor-max-tokens"),
        "selfplay.max_context_tokens": (32768, f"{f}:{n['temp'] + 4} --spade-max-context-length"),
        "selfplay.max_turns": (25, f"{f}:{n['temp'] + 5} --spade-max-turns"),
        "selfplay.difficulty": ("medium", f"{f}:{n['difficulty']} --spade-game-difficulty medium"),
        "selfplay.memory_capacity": (200, f"{f}:{n['memory']} --spade-env-memory-max-size 200"),
        "selfplay.use_memory": (True, f"{f}:{n['memory']} --spade-use-env-memory"),
        "selfplay.use_corpus": (True, f"{f}:{n['corpus'] - 1} --spade-corpus-file"),
        "selfplay.train_designer": (True, f"{f}:{n['no_train']} NO_PROPOSER_TRAIN:-0"),
        "selfplay.plays.mask_truncated": (False, f"{f}:{n['spade_args']} SPADE_ARGS=("),
        "selfplay.plays.drop_equal_return_groups": (False, f"{ROLLOUT}:688"),
        "selfplay.rewards.designer_reward": ("regret_plateau", f"{f}:{n['blend']} --spade-env-reward-variant blend"),
        "selfplay.rewards.plateau_weight": (0.6, f"{f}:{n['blend'] + 1} --spade-plateau-weight"),
        "selfplay.rewards.regret_weight": (0.4, f"{f}:{n['blend'] + 2} --spade-regret-weight"),
        "selfplay.rewards.regret_scale": (0.15, f"{f}:{n['blend'] + 4} --spade-regret-scale 0.15"),
        "selfplay.rewards.plateau_lo": (0.4, f"{f}:{n['blend'] + 7} --spade-plateau-lo"),
        "selfplay.rewards.plateau_hi": (0.6, f"{f}:{n['blend'] + 8} --spade-plateau-hi"),
        "selfplay.rewards.plateau_ramp": (0.25, f"{f}:{n['blend'] + 9} --spade-plateau-ramp"),
        "selfplay.rewards.lp_gamma_fast": (0.98, f"{f}:{n['temp'] - 2} --spade-gamma1 0.98"),
        "selfplay.rewards.lp_gamma_slow": (0.85, f"{f}:{n['temp'] - 1} --spade-gamma2 0.85"),
        "selfplay.skills.curriculum": ("full", f"{f}:{n['skills']} --spade-skills"),
        "selfplay.skills.skills": (None, f"{f}:{n['skills']} --spade-skills"),
        "selfplay.skills.window": (3, f"{f}:{n['skills'] + 1} --spade-skills-per-regen"),
        "corpus.max_words": (6000, f"{f}:{n['corpus']} --spade-corpus-max-doc-tokens 6000"),
        "corpus.seed": (42, f"{f}:{n['corpus'] + 1} --spade-corpus-seed 42"),
        "run.steps": (400, f"{f}:{n['batch'] - 1} --num-rollout"),
        "run.checkpoint_every": (16, f"{f}:{n['save']} --save-interval 16"),
        "run.keep_checkpoints": (0, f"{f}:{n['save']} --save-interval 16"),  # slime keeps every checkpoint
        "eval.every": (0, f"{f}:{n['eval']} --eval-interval"),  # 100000: never within 400 rollouts
    }


GAMES_4B = {
    **_games(G4, dict(template=101, lr=188, eps=165, regen=93, batch=74, hint=115, temp=86, difficulty=98, memory=142,
                      corpus=129, no_train=134, spade_args=83, blend=104, skills=94, save=67, eval=179, tp=146,
                      sglang=196, size="4b", corpus_check=f"{G4}:36-37 Set CORPUS_FILE")),
    "model.hf_dir": ("models/Qwen3-4B-Instruct-2507", f"{G4}:63 Qwen3-4B-Instruct-2507"),
    "model.thinking": ("auto", f"{G4}:70-81 ROLLOUT_ARGS"),  # no chat-template switch: the Instruct-2507 model
    "loss.kl_coef": (0.0, f"{G4}:162 --kl-loss-coef 0.00"),
    "loss.sample_mean_denominator": ("samples", KL_RESCALE),  # KL off: the short batch is rescaled
    "selfplay.sampling.designer.max_tokens": (16384, f"{G4}:89 --spade-env-max-tokens 16384"),
}
GAMES_8B = {
    **_games(G8, dict(template=109, lr=212, eps=189, regen=101, batch=81, hint=114, temp=94, difficulty=106, memory=166,
                      corpus=153, no_train=158, spade_args=91, blend=122, skills=102, save=74, eval=203, tp=170,
                      sglang=220, size="8b", corpus_check=f"{G8}:35-36 Set CORPUS_FILE")),
    "model.hf_dir": ("models/Qwen3-8B", f"{G8}:70 Qwen3-8B"),
    "model.thinking": ("on", f"{G8}:111 --spade-env-enable-thinking"),
    "selfplay.sampling.hint.thinking": ("off", f"{G8}:88 \"enable_thinking\":false"),
    "selfplay.sampling.screen.thinking": ("off", f"{G8}:88 \"enable_thinking\":false"),
    "selfplay.sampling.designer.thinking": ("off", "spade/core/corpus_orchestrator.py:113 self.model.apply_template(messages)"),
    "selfplay.sampling.agent.hinted_thinking": ("off", f"{G8}:88 \"enable_thinking\":false"),
    "selfplay.plays.sample_form": ("per_turn", "spade/slime/trajectory_converter.py:80-81 def fan_out_thinking_sample"),
    "loss.kl_coef": (0.005, f"{G8}:186 KL_COEF:-0.005"),
    "loss.sample_mean_denominator": (192, KL_RESCALE),  # KL on: no rescale, slime divides by 192
    "selfplay.sampling.designer.max_tokens": (20000, f"{G8}:97 --spade-env-max-tokens 20000"),
}
GAMES_30B = {
    **_games(G30, dict(template=128, lr=247, eps=224, regen=120, batch=100, hint=132, temp=113, difficulty=125,
                       memory=199, corpus=186, no_train=191, spade_args=110, blend=141, skills=121, save=93, eval=238,
                       tp=203, sglang=258, size="30b", corpus_check=f"{G30}:35-36 Set CORPUS_FILE")),
    "model.hf_dir": ("models/Qwen3-30B-A3B-Instruct-2507", f"{G30}:89 Qwen3-30B-A3B-Instruct-2507"),
    "model.thinking": ("auto", f"{G30}:107 \"enable_thinking\":false"),
    "loss.kl_coef": (0.0, f"{G30}:221 --kl-loss-coef 0.00"),
    "loss.sample_mean_denominator": ("samples", KL_RESCALE),
    "selfplay.sampling.designer.max_tokens": (16384, f"{G30}:116 --spade-env-max-tokens 16384"),
}
PHASE2 = {
    **GAMES_4B,
    "selfplay.max_context_tokens": (49152, "cmd/games/README.md:23-25 MAX_CONTEXT_LENGTH=49152"),
    "selfplay.rewards.plateau_lo": (0.2, "cmd/games/README.md:23-25 PLATEAU_LO=0.2"),
    "selfplay.rewards.plateau_hi": (0.4, "cmd/games/README.md:23-25 PLATEAU_HI=0.4"),
    "selfplay.rewards.plateau_ramp": (0.2, "cmd/games/README.md:23-25 PLATEAU_RAMP=0.2"),
}


def _tool_blend(size: str) -> dict:
    """cmd/tool_use/_train_spade_blend.sh with TOOL_MODEL_SIZE=8b or 30b."""
    return {
        **_released_code(),
        **_trainer(TB, lr=243, eps=221, grpo=214, tp=26 if size == "8b" else 49, size=size,
                   sglang=37 if size == "8b" else 62, mem=0.7 if size == "8b" else 0.85, temp=157),
        **_switches(TB, gbs=158, template=184, corpus_check=f"{TB}:12 Set CORPUS_FILE"),
        "selfplay.domain": ("tool_use", f"{TB}:181 --spade-game-type tool_use"),
        "loss.kl_coef": (0.005, f"{TB}:218 --kl-loss-coef 0.005"),
        "loss.sample_mean_denominator": (192, KL_RESCALE),
        "selfplay.k": (8, f"{TB}:174 REGEN_INTERVAL:-8"),
        "selfplay.envs_per_set": (24, f"{TB}:154 --rollout-batch-size 24"),
        "selfplay.g_nohint": (8, f"{TB}:158 --global-batch-size 192"),
        "selfplay.g_hint": (16, f"{TB}:200 --spade-hint-plays-per-game 16"),
        "selfplay.sampling.designer.temperature": (0.6, f"{TB}:167 --spade-env-temperature 0.6"),
        "selfplay.sampling.agent.temperature": (0.6, f"{TB}:168 --spade-actor-temperature 0.6"),
        "selfplay.sampling.hint.temperature": (0.3, f"{TB}:198 --spade-hint-temperature 0.3"),
        "selfplay.sampling.hint.max_tokens": (2048, f"{TB}:199 HINT_MAX_TOKENS:-2048"),
        "selfplay.sampling.agent.max_tokens": (8192, f"{TB}:169 ACTOR_MAX_TOKENS:-8192"),
        "selfplay.max_context_tokens": (32768, f"{TB}:171 MAX_CONTEXT_LENGTH:-32768"),
        "selfplay.max_turns": (25, f"{TB}:172 MAX_TURNS:-25"),
        "selfplay.difficulty": ("medium", f"{TB}:178 --spade-game-difficulty medium"),
        "selfplay.sampling.screen.max_tokens": (16384, f"{ARGS}:538-541 --spade-env-validator-max-tokens"),
        "selfplay.sampling.screen.temperature": (0.3, "spade/core/types.py:188 env_validator_temperature: float = 0.3"),
        "selfplay.sampling.screen.timeout_s": (120.0, "spade/core/corpus_orchestrator.py:166-169 timeout=120"),
        # the validator call, like the hint's, passes no top-p and no top-k: the adapter's 0.9, no top-k
        "selfplay.sampling.screen.top_p": (0.9, "spade/slime/model_adapter.py:155 top_p: float = 0.9"),
        "selfplay.sampling.screen.top_k": (None, "spade/core/env_validator.py:157-163 temperature=self.temperature"),
        "selfplay.plays.mask_truncated": (True, f"{TB}:202 --spade-compact-filter"),
        "selfplay.plays.drop_equal_return_groups": (False, f"{TB}:150-162 ROLLOUT_ARGS"),
        "selfplay.plays.tool_mask_malformed_calls": (True, f"{TB}:272 SPADE_MASK_MALFORMED_TOOLCALL"),
        "selfplay.admission.tool_use.model_screen": (True, f"{TB}:185 --spade-use-env-validator"),
        "selfplay.memory_capacity": (200, f"{TB}:207 --spade-env-memory-max-size 200"),
        "selfplay.use_memory": (True, f"{TB}:206 --spade-use-env-memory"),
        "selfplay.use_corpus": (True, f"{TB}:203 --spade-corpus-file"),
        "selfplay.train_designer": (True, f"{TB}:164-208 SPADE_ARGS"),
        "selfplay.rewards.designer_reward": ("regret_plateau", f"{TB}:187 --spade-env-reward-variant blend"),
        "selfplay.rewards.plateau_weight": (0.6, f"{TB}:188 --spade-plateau-weight 0.6"),
        "selfplay.rewards.regret_weight": (0.4, f"{TB}:189 --spade-regret-weight 0.4"),
        "selfplay.rewards.regret_scale": (0.15, f"{TB}:191 --spade-regret-scale 0.15"),
        "selfplay.rewards.plateau_lo": (0.4, f"{TB}:194 --spade-plateau-lo 0.4"),
        "selfplay.rewards.plateau_hi": (0.6, f"{TB}:195 --spade-plateau-hi 0.6"),
        "selfplay.rewards.plateau_ramp": (0.25, f"{TB}:196 --spade-plateau-ramp 0.25"),
        "selfplay.skills.curriculum": ("full", f"{TB}:182 --spade-skills API_Orchestration"),
        "selfplay.skills.window": (None, f"{ARGS}:213-221 --spade-skills-per-regen"),  # absent: all six
        "corpus.max_words": (4000, f"{TB}:204 --spade-corpus-max-doc-tokens 4000"),
        "corpus.seed": (42, f"{TB}:205 --spade-corpus-seed 42"),
        "run.steps": (400, f"{TB}:153 NUM_ROLLOUT:-400"),
        "run.checkpoint_every": (16, f"{TB}:147 SAVE_INTERVAL:-16"),
        "run.keep_checkpoints": (0, f"{TB}:147 SAVE_INTERVAL:-16"),
        "eval.every": (32, f"{TB}:235 EVAL_INTERVAL:-32"),
    }


TOOL_8B = {
    **_tool_blend("8b"),
    "model.hf_dir": ("models/Qwen3-8B", f"{TB}:22 Qwen3-8B"),
    "model.thinking": ("on", f"{TB}:24 ENABLE_THINKING=1"),
    "selfplay.sampling.hint.thinking": ("off", f"{TB}:161 \"enable_thinking\":false"),
    "selfplay.sampling.screen.thinking": ("off", f"{TB}:161 \"enable_thinking\":false"),
    "selfplay.sampling.designer.thinking": ("off", "spade/core/corpus_orchestrator.py:113 self.model.apply_template(messages)"),
    "selfplay.sampling.agent.hinted_thinking": ("auto", f"{ORCH}:1839-1841 Hinted tool-use plays must follow the native tool-call path"),
    "selfplay.plays.sample_form": ("sequence", f"{ORCH}:1839-1841 native tool-call path"),
    "selfplay.sampling.designer.max_tokens": (20000, f"{TB}:23 ENV_MAX_TOKENS:-20000"),
}
TOOL_30B = {
    **_tool_blend("30b"),
    "model.hf_dir": ("models/Qwen3-30B-A3B-Instruct-2507", f"{TB}:45 Qwen3-30B-A3B-Instruct-2507"),
    "model.thinking": ("auto", f"{TB}:47 ENABLE_THINKING=0"),
    "selfplay.sampling.designer.max_tokens": (16384, f"{TB}:46 ENV_MAX_TOKENS:-16384"),
}
TOOL_4B = {
    **_released_code(),
    **_trainer(T4, lr=150, eps=128, grpo=121, tp=109, size="4b", sglang=158, mem=0.7, temp=63, logprob_t=0.7),
    **_switches(T4, gbs=64, template=89, corpus_check=f"{T4}:28 Set CORPUS_FILE", global_batch=256),
    "model.hf_dir": ("models/Qwen3-4B-Instruct-2507", f"{T4}:50 Qwen3-4B-Instruct-2507"),
    "model.thinking": ("auto", f"{T4}:56-68 ROLLOUT_ARGS"),
    "selfplay.domain": ("tool_use", f"{T4}:86 --spade-game-type tool_use"),
    "loss.kl_coef": (0.005, f"{T4}:125 --kl-loss-coef 0.005"),
    "loss.sample_mean_denominator": (256, KL_RESCALE),
    "selfplay.k": (32, f"{T4}:80 --spade-game-regeneration-interval 32"),
    "selfplay.envs_per_set": (16, f"{T4}:60 --rollout-batch-size 16"),
    "selfplay.g_nohint": (16, f"{T4}:64 --global-batch-size 256"),
    "selfplay.g_hint": (4, f"{T4}:95 --spade-hint-plays-per-game 4"),
    "selfplay.sampling.designer.max_tokens": (16384, f"{T4}:76 --spade-env-max-tokens 16384"),
    "selfplay.sampling.agent.max_tokens": (8192, f"{T4}:75 --spade-actor-max-tokens 8192"),
    "selfplay.sampling.hint.max_tokens": (512, f"{T4}:94 --spade-hint-max-tokens 512"),
    "selfplay.sampling.hint.temperature": (0.3, f"{T4}:93 --spade-hint-temperature 0.3"),
    "selfplay.sampling.designer.temperature": (0.6, f"{T4}:73 --spade-env-temperature 0.6"),
    "selfplay.sampling.agent.temperature": (0.6, f"{T4}:74 --spade-actor-temperature 0.6"),
    "selfplay.max_context_tokens": (32768, f"{T4}:77 --spade-max-context-length 32768"),
    "selfplay.max_turns": (25, f"{T4}:78 --spade-max-turns 25"),
    "selfplay.difficulty": ("medium", f"{T4}:83 --spade-game-difficulty medium"),
    "selfplay.plays.drop_equal_return_groups": (True, f"{T4}:67 check_reward_nonzero_std"),
    "selfplay.plays.refill_equal_groups": (0, f"{T4}:67 check_reward_nonzero_std"),
    "selfplay.plays.mask_truncated": (True, f"{T4}:102 --spade-compact-filter"),
    "selfplay.plays.tool_mask_malformed_calls": (True, f"{T4}:184 SPADE_MASK_MALFORMED_TOOLCALL"),
    "selfplay.admission.tool_use.model_screen": (True, f"{T4}:104 --spade-use-env-validator"),
    "selfplay.memory_capacity": (200, f"{T4}:105 --spade-env-memory-max-size 200"),
    "selfplay.use_memory": (True, f"{T4}:103 --spade-use-env-memory"),
    "selfplay.use_corpus": (True, f"{T4}:99 --spade-corpus-file"),
    # regret_based (T4:91): max(0, hinted mean - window no-hint mean), no scale, cap or masking
    # (spade/core/utils/delayed_env_rewards.py:343-348; ReleasedRegretReward)
    "selfplay.rewards.designer_reward": ("regret_released", f"{T4}:91 --spade-env-reward-variant regret_based"),
    "selfplay.rewards.step_timeout_penalty": (-0.5, "spade/core/utils/rewards.py:8 STEP_TIMEOUT_PENALTY = -0.5"),
    "selfplay.skills.window": (None, f"{T4}:87 --spade-skills API_Orchestration"),
    "corpus.max_words": (4000, f"{T4}:100 --spade-corpus-max-doc-tokens 4000"),
    "corpus.seed": (42, f"{T4}:101 --spade-corpus-seed 42"),
    "run.steps": (500, f"{T4}:59 --num-rollout 500"),
    "run.checkpoint_every": (16, f"{T4}:53 --save-interval 16"),
    "eval.every": (48, f"{T4}:142 --eval-interval 48"),
}


def _actor_only(table: dict) -> dict:
    """The settings a baseline without a designer keeps from its size's SPADE recipe (the rest are
    its own rows or are not read without a designer)."""
    keep = ("model.", "parallel.", "engine.", "optimizer.", "loss.", "sandbox.", "run.seed", "run.overlap",
            "selfplay.sampling.agent.top_", "selfplay.rollout_shards", "selfplay.partial_rollouts", "run.keep_checkpoints")
    return {key: cited for key, cited in table.items() if key.startswith(keep)}


def _fixed_gpt55(size: str, kl: float, kl_line: int, name_line: int, tp: int, sglang: int) -> dict:
    base = {"4b": GAMES_4B, "8b": GAMES_8B, "30b": GAMES_30B}[size]
    return {
        **_actor_only(base),
        **_trainer(F, lr=255, eps=232, grpo=224, tp=tp, size=size, sglang=sglang, mem=0.7, temp=189),
        "selfplay.batch.nohint_plays": ("global_batch", f"{ORCH}:2382 math.ceil(global_batch_size / len(selected_game_files))"),
        "selfplay.batch.global_batch": (192, f"{F}:13 GLOBAL_BATCH_SIZE:-192"),
        "selfplay.batch.cut_to_global_batch": (True, f"{ROLLOUT}:836-838 grouped_samples[:global_batch_size]"),
        # the fixed pool plays through the designer runs' rollout function and orchestrator
        "selfplay.plays.env_faults": ("retry_then_drop", f"{F}:184 spade.slime.spade_rollout.spade_generate_rollout"),
        "selfplay.plays.nohint_play_timeout_s": (300.0, f"{ORCH}:1521 per_game_timeout = 300"),
        "selfplay.action_extraction": ("first_flat_box", "spade/core/utils/parsing.py:7-36 def extract_boxed_answer"),
        "selfplay.agent_game_prompt": ("paper", f"{F}:213 --spade-actor-template qwen3_game"),
        "model.hf_dir": (base["model.hf_dir"][0], f"{F}:{name_line} MODEL_NAME="),
        "model.thinking": ("on" if size == "8b" else "auto", f"{F}:{name_line + 2} ACTOR_THINKING="),
        "loss.kl_coef": (kl, f"{F}:{kl_line} KL_COEF="),
        "selfplay.env_source": ("fixed_pool", f"{F}:217 --spade-static-game-pool"),
        "selfplay.fixed_env_dir": ("pools/gpt55_games", f"{F}:9 STATIC_POOL_DIR"),
        "selfplay.pool.draw": ("shuffle", f"{F}:218 --spade-no-replacement"),
        "selfplay.pool.seed": (42, f"{ARGS}:694-696 --spade-fixed-pool-seed"),
        "selfplay.pool.released_loader_names": (True, "spade/core/envs/synthetic_game_env.py:194 _inject_common_stdlib"),
        "selfplay.envs_per_set": (24, f"{F}:12 ROLLOUT_BATCH_SIZE:-24"),
        "selfplay.k": (1, f"{F}:204 --spade-game-regeneration-interval 0"),
        "selfplay.g_nohint": (8, f"{F}:13 GLOBAL_BATCH_SIZE:-192"),
        "selfplay.g_hint": (0, f"{F}:196-219 SPADE_ARGS"),
        "selfplay.sampling.agent.temperature": (0.6, f"{F}:199 --spade-actor-temperature 0.6"),
        "selfplay.sampling.agent.max_tokens": (8192, f"{F}:200 ACTOR_MAX_TOKENS:-8192"),
        "selfplay.max_context_tokens": (32768, f"{F}:14 MAX_CONTEXT_LENGTH:-32768"),
        "selfplay.max_turns": (25, f"{F}:15 MAX_TURNS:-25"),
        "selfplay.use_corpus": (False, f"{F}:196-219 SPADE_ARGS"),
        "selfplay.use_memory": (False, f"{F}:196-219 SPADE_ARGS"),
        "selfplay.train_designer": (False, f"{F}:215 --spade-no-train-on-env-trajectories"),
        "run.steps": (400, f"{F}:11 NUM_ROLLOUT:-400"),
        "run.checkpoint_every": (16, f"{F}:179 SAVE_INTERVAL:-16"),
        "eval.every": (0, f"{F}:246 EVAL_INTERVAL:-100000"),
    }


FIXED_4B = _fixed_gpt55("4b", 0.0, 43, 42, tp=46, sglang=57)
FIXED_8B = {**_fixed_gpt55("8b", 0.005, 66, 65, tp=69, sglang=80),
            "selfplay.plays.sample_form": ("per_turn", f"{F}:220-221 --spade-actor-enable-thinking")}
FIXED_30B = _fixed_gpt55("30b", 0.0, 89, 88, tp=92, sglang=105)


def _rlve(size: str, shift: int, *, kl: int, eval_line: int, lr: int, eps: int, tp: int, sglang: int) -> dict:
    f = f"cmd/games/train_fixed_rlve_{size}.sh"
    base = {"4b": GAMES_4B, "8b": GAMES_8B, "30b": GAMES_30B}[size]

    def at(line: int) -> str:
        return f"{f}:{line + shift}"

    args = f"{at(93)}-{114 + shift} SPADE_ARGS=("
    return {
        **_actor_only(base),
        **_trainer(f, lr=lr, eps=eps, grpo=eps - 7, tp=tp, size=size, sglang=sglang, mem=0.7, temp=86 + shift),
        "selfplay.batch.global_batch": (256, f"{at(87)} --global-batch-size 256"),
        "selfplay.batch.cut_to_global_batch": (True, "spade/slime/fixed_env_rollout.py:469-470 all_samples[:global_batch_size]"),
        # a short batch is filled with real copies: the step always divides by its own count
        "loss.sample_mean_denominator": ("samples", "spade/slime/fixed_env_rollout.py:455-470 Trim or pad to exact batch size"),
        "selfplay.plays.nohint_play_timeout_s": (None, "spade/core/fixed_env_orchestrator.py:555 "
                                                       "tasks = [self.play_env_async(inst) for inst, _ in instances]"),
        "selfplay.agent_game_prompt": ("paper", f"{at(105)} --spade-actor-template qwen3_game"),
        "model.hf_dir": (base["model.hf_dir"][0], f"{at(72)} --hf-checkpoint"),
        "loss.kl_coef": (0.0, f"{f}:{kl} --kl-loss-coef 0.00"),
        "selfplay.env_source": ("rlve", f"{at(94)} --spade-mode fixed_env"),
        "selfplay.rlve.environments": ("official16", f"{at(27)} RLVE_ENV_SET:-official16"),
        "selfplay.rlve.reward": ("accuracy", "spade/core/envs/rlve_adapter.py:168-169 reward = 1.0 if correct else 0.0"),
        "selfplay.rlve.difficulty_window": (4, f"{at(102)} --spade-difficulty-d-delta 4"),
        "selfplay.rlve.accuracy_samples": (128, f"{at(101)} --spade-difficulty-tau-num 128"),
        "selfplay.rlve.accuracy_threshold": (0.9, f"{at(100)} --spade-difficulty-tau-acc 0.9"),
        "selfplay.k": (1, f"{at(96)} --spade-game-regeneration-interval 1"),
        "selfplay.envs_per_set": (16, f"{at(83)} --rollout-batch-size 16"),
        "selfplay.g_nohint": (16, f"{at(87)} --global-batch-size 256"),
        "selfplay.g_hint": (0, args),
        "selfplay.sampling.agent.temperature": (1.0, f"{at(106)} --spade-actor-temperature 1.0"),
        "selfplay.sampling.agent.max_tokens": (8192, f"{at(107)} ACTOR_MAX_TOKENS:-8192"),
        "selfplay.max_context_tokens": (32768, f"{at(108)} MAX_CONTEXT_LENGTH:-32768"),
        "selfplay.max_turns": (25, f"{at(109)} MAX_TURNS:-25"),
        "selfplay.use_corpus": (False, args),
        "selfplay.use_memory": (False, args),
        "selfplay.train_designer": (False, f"{at(94)} --spade-mode fixed_env"),
        "run.steps": (400, f"{at(82)} NUM_ROLLOUT:-400"),
        "run.checkpoint_every": (16, f"{at(76)} --save-interval 16"),
        "eval.every": (0, f"{f}:{eval_line} EVAL_INTERVAL:-100000"),
    }


RLVE_4B = _rlve("4b", 1, kl=134, eval_line=151, lr=160, eps=137, tp=118, sglang=168)
RLVE_8B = {**_rlve("8b", 0, kl=133, eval_line=150, lr=159, eps=136, tp=117, sglang=167),
           "model.thinking": ("on", "cmd/games/train_fixed_rlve_8b.sh:90 \"enable_thinking\":true"),
           "selfplay.plays.sample_form": ("sequence", "spade/slime/fixed_env_rollout.py:446-453 trajectory_to_slime_sample")}
RLVE_30B = _rlve("30b", 0, kl=135, eval_line=152, lr=161, eps=138, tp=117, sglang=172)

A = "cmd/ablations"
RELEASED: dict[str, dict] = {
    "games_4b.yaml": GAMES_4B,
    "games_4b_phase2.yaml": PHASE2,
    "games_8b.yaml": GAMES_8B,
    "games_30b_a3b.yaml": GAMES_30B,
    "tool_use_4b.yaml": TOOL_4B,
    "tool_use_8b.yaml": TOOL_8B,
    "tool_use_30b_a3b.yaml": TOOL_30B,
    "baseline_fixed_gpt55_4b.yaml": FIXED_4B,
    "baseline_fixed_gpt55_8b.yaml": FIXED_8B,
    "baseline_fixed_gpt55_30b.yaml": FIXED_30B,
    "baseline_fixed_rlve_4b.yaml": RLVE_4B,
    "baseline_fixed_rlve_8b.yaml": RLVE_8B,
    "baseline_fixed_rlve_30b.yaml": RLVE_30B,
    "ablation_no_corpus_30b.yaml": {
        **{k: v for k, v in GAMES_30B.items() if k != "selfplay.use_corpus"},
        "selfplay.use_corpus": (False, f"{A}/train_no_corpus_30b.sh:6 CORPUS_FILE=\"\""),
        "selfplay.no_corpus_prompt": ("concepts", "spade/core/prompts/template.py:389 def generate_multiturn_game_generation_prompt"),
    },
    "ablation_no_memory_30b.yaml": {
        **GAMES_30B,
        "selfplay.use_memory": (False, f"{A}/train_no_memory_30b.sh:6 NO_ENV_MEMORY=1"),
    },
    "ablation_no_ed_training_no_memory_30b.yaml": {
        **GAMES_30B,
        "selfplay.train_designer": (False, f"{A}/train_no_ed_training_no_memory_30b.sh:6 NO_PROPOSER_TRAIN=1"),
        "selfplay.use_memory": (False, f"{A}/train_no_ed_training_no_memory_30b.sh:7 NO_ENV_MEMORY=1"),
    },
    "ablation_two_skill_30b.yaml": {
        **GAMES_30B,
        "selfplay.skills.skills": (("Mathematical Reasoning", "Pattern Recognition"),
                                   f"{A}/train_two_skill_30b.sh:6 Mathematical_Reasoning Pattern_Recognition"),
        "selfplay.skills.window": (2, f"{A}/train_two_skill_30b.sh:7 SKILLS_PER_REGEN=2"),
    },
    "ablation_learning_potential_30b.yaml": {
        **GAMES_30B,
        "selfplay.rewards.designer_reward": ("learning_potential",
                                             f"{A}/train_learning_potential_30b.sh:6 REWARD_VARIANT=learning_potential"),
    },
    "ablation_solve_rate_30b.yaml": {
        **GAMES_30B,
        "selfplay.rewards.plateau_weight": (1.0, f"{G30}:161 --spade-plateau-weight 1.0"),
        "selfplay.rewards.regret_weight": (0.0, f"{G30}:162 --spade-regret-weight 0.0"),
        "selfplay.rewards.plateau_lo": (0.4, f"{A}/train_solve_rate_30b.sh:7 PLATEAU_LO:-0.4"),
        "selfplay.rewards.plateau_hi": (0.6, f"{A}/train_solve_rate_30b.sh:8 PLATEAU_HI:-0.6"),
        "selfplay.rewards.plateau_ramp": (0.25, f"{A}/train_solve_rate_30b.sh:9 PLATEAU_RAMP:-0.25"),
    },
    "ablation_fixed_gpt55_30b.yaml": {
        **FIXED_30B,
        "selfplay.env_source": ("fixed_pool", f"{A}/train_fixed_gpt55_30b.sh:5 train_fixed_gpt55_30b.sh"),
    },
}
BASES = ("games_base.yaml", "tool_use_base.yaml")

# The switches where spade's own recipes keep spade's choice and the reproduction recipes the
# released one: key -> (spade's value, the released value). docs/fidelity.md has a row for each.
SWITCHES: dict[str, tuple] = {
    "selfplay.g_nohint": (16, 8),                              # the paper's 16 plays; the code's 192 / 24
    "loss.aggregation": ("token_mean", "sample_mean"),          # token-level; per-sample mean first
    "loss.logprob_temperature": ("sampling", 1.0),             # each sample's own temperature; slime's 1.0
    "selfplay.batch.nohint_plays": ("g_nohint", "global_batch"),
    "selfplay.action_extraction": ("last_box", "first_flat_box"),
    "selfplay.plays.reset_seeds": ("paired", "independent"),
    "selfplay.agent_game_prompt": ("spade", "paper"),
    "corpus.require_real": (False, True),
    "selfplay.admission.probes": (True, False),                # degenerate-policy probes (issue 23)
    "selfplay.admission.determinism": (True, False),           # determinism stage (SPEC 3.5)
    "selfplay.admission.paper_exact": (False, True),
    "selfplay.admission.smoke_test": ("paper", "released"),    # SPEC 3.4's checked smoke test
}
# spade's designer games and tool-use recipes (the baselines vary one of them and keep these too)
OWN_RECIPES = sorted(p.name for p in OWN.glob("*.yaml")
                     if p.name.startswith(("qwen3_", "tool_use_", "games_base", "ablation_")))


def value_at(config, key: str):
    node = config
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def _same(got, want) -> bool:
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(map(_same, got, want))
    if isinstance(want, float) and not isinstance(got, bool):
        return isinstance(got, (int, float)) and abs(got - want) <= 1e-12 * max(1.0, abs(want))
    if isinstance(want, bool) or want is None:
        return got is want
    return got == want


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_every_setting_is_the_released_one(name):
    config = load_train_config(PAPER / name, [])
    wrong = [f"{key}: recipe has {value_at(config, key)!r}, released {want!r} ({cite})"
             for key, (want, cite) in sorted(RELEASED[name].items()) if not _same(value_at(config, key), want)]
    assert not wrong, f"{name} differs from the released run:\n  " + "\n  ".join(wrong)


def test_every_launcher_has_a_recipe_and_every_recipe_a_row():
    files = {p.name for p in PAPER.glob("*.yaml")}
    assert files == set(RELEASED) | set(BASES), files ^ (set(RELEASED) | set(BASES))
    for name in BASES:
        load_train_config(PAPER / name, [])  # the bases validate on their own too
    for table in RELEASED.values():
        assert len(table) >= 20


def _includes(path: Path) -> list[Path]:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    names = data.get("include") or []
    names = [names] if isinstance(names, str) else names
    found = []
    for name in names:
        target = (path.parent / name).resolve()
        found += [target, *_includes(target)]
    return found


@pytest.mark.parametrize("name", sorted(RELEASED) + list(BASES))
def test_paper_recipes_include_only_paper_recipes(name):
    # a change to spade's own recipes cannot leak into a reproduction
    for target in _includes(PAPER / name):
        assert target.parent == PAPER.resolve(), f"{name} includes {target}, outside examples/recipes/paper/"
    read_config_file(PAPER / name)


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_model_and_corpus_are_placeholders_the_header_names(name):
    """The model is a placeholder under models/ (users point it at their checkpoint); the corpus is
    the demo stand-in, marked PLACEHOLDER in the base; the header names the released launcher."""
    text = (PAPER / name).read_text()
    config = load_train_config(PAPER / name, [])
    assert config.model.hf_dir.startswith("models/Qwen3-"), config.model.hf_dir
    if config.selfplay.designer_enabled and config.selfplay.use_corpus:
        assert [Path(p).name for p in config.corpus.paths] == ["demo.jsonl.gz"]
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any(re.search(r"cmd/\w+/\w+\.sh", line) for line in header), f"{name} names no released launcher"


@pytest.mark.parametrize("key", sorted(SWITCHES))
def test_the_two_families_stay_apart(key):
    own, released = SWITCHES[key]
    assert own != released
    for name in OWN_RECIPES:
        config = load_train_config(OWN / name, [])
        if key == "selfplay.g_nohint" and config.selfplay.env_source == "rlve":
            continue
        assert _same(value_at(config, key), own), f"spade's {name}: {key} is {value_at(config, key)!r}, spade's choice {own!r}"
    for name in RELEASED:
        config = load_train_config(PAPER / name, [])
        if key == "selfplay.g_nohint" and (config.selfplay.env_source == "rlve" or name == "tool_use_4b.yaml"):
            continue  # 256 / 16 in those launchers
        if key == "loss.logprob_temperature" and name == "tool_use_4b.yaml":
            continue  # --rollout-temperature 0.7 there
        if key == "selfplay.batch.nohint_plays" and config.selfplay.env_source == "rlve":
            continue  # rlve plays g_nohint problems' samples (released: 256 / 16 = 16 each)
        assert _same(value_at(config, key), released), f"paper/{name}: {key} is {value_at(config, key)!r}"


def test_spade_recipes_keep_no_released_bound_penalty_or_denominator():
    # the issue-39 keys whose released value only some reproduction recipes take: spade's own keep
    # today's behaviour (no time bound, the real sample count, no step-timeout penalty)
    for name in OWN_RECIPES:
        config = load_train_config(OWN / name, [])
        s = config.selfplay
        got = (s.plays.hint_turn_timeout_s, s.plays.nohint_play_timeout_s, s.set_generation_timeout_s,
               config.loss.sample_mean_denominator, s.rewards.step_timeout_penalty)
        assert got == (None, None, None, "samples", None), f"spade's {name}: {got}"


def test_spade_recipes_keep_routing_replay_on_the_moe_model():
    # spade's choice (issue 27); the release never replays the rollout's routing
    for name in OWN_RECIPES:
        config = load_train_config(OWN / name, [])
        if config.parallel.ep > 1:
            assert config.loss.routing_replay == "rollout", name
    assert load_train_config(PAPER / "games_30b_a3b.yaml", []).loss.routing_replay == "off"


# ------------------------------------------------------------ the citations against the released code


CITATION = re.compile(r"^(?P<file>[\w./-]+):(?P<first>\d+)(?:-(?P<last>\d+))?(?: (?P<text>.+))?$")


@lru_cache(maxsize=None)
def released_file(path: str) -> list[str] | None:
    if not MIRROR.is_dir():
        return None
    out = subprocess.run(["git", "-C", str(MIRROR), "show", f"{RELEASED_COMMIT}:{path}"], capture_output=True,
                         text=True)
    return out.stdout.splitlines() if out.returncode == 0 else []


def test_citations_are_well_formed():
    for name, table in RELEASED.items():
        for key, (_, cite) in table.items():
            assert CITATION.match(cite), f"{name} {key}: citation {cite!r} is not file:line[-line] [text]"


def test_cited_lines_hold_the_cited_text():
    if released_file(G4) is None:
        pytest.skip(f"no copy of the released repository at {MIRROR} (set SPADE_RELEASED_REPO)")
    bad = []
    for name, table in RELEASED.items():
        for key, (_, cite) in table.items():
            match = CITATION.match(cite)
            lines = released_file(match["file"])
            first, last = int(match["first"]), int(match["last"] or match["first"])
            if not lines:
                bad.append(f"{name} {key}: {match['file']} is not in the release")
            elif last > len(lines):
                bad.append(f"{name} {key}: {match['file']} has {len(lines)} lines, cited {last}")
            elif match["text"] and match["text"] not in "\n".join(lines[first - 1:last]):
                bad.append(f"{name} {key}: {cite!r}, but the lines hold {lines[first - 1:last]}")
    assert not bad, "\n".join(bad)
