"""``corpus.require_real`` (issue 39): a reproduction run refuses the demo corpus, in preflight and in
``spade train --check``; the default (and the smoke run) keeps using it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import prewarmed
from spade.config import ConfigError
from spade.designer.corpus import CorpusSettings, demo_corpus_files
from spade.run.preflight import check_real_corpus, paper_recipe
from spade.run.run_dir import RunDirError
from spade.train_config import from_dict

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "examples" / "corpus" / "demo.jsonl.gz")


def _config(paths, **selfplay):
    return from_dict({"corpus": {"paths": list(paths), "require_real": True},
                      "selfplay": {"use_corpus": True, **selfplay}})


def _real(tmp_path: Path) -> str:
    path = tmp_path / "real.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps({"text": "A real document about primes."}) + "\n")
    return str(path)


def test_default_keeps_the_demo_corpus():
    assert CorpusSettings().require_real is False
    check_real_corpus(from_dict({"corpus": {"paths": [DEMO]}, "selfplay": {"use_corpus": True}}))  # no refusal


@pytest.mark.parametrize("paths", [[DEMO], [str(ROOT / "examples" / "corpus")], [str(ROOT / "examples/corpus/demo*.gz")]])
def test_require_real_refuses_the_demo_corpus_however_it_is_named(paths):
    assert demo_corpus_files(tuple(paths))
    with pytest.raises(RunDirError) as refused:
        check_real_corpus(_config(paths))
    message = str(refused.value)
    for part in ("corpus.paths", "demo corpus", "corpus.require_real", "DCLM", "MegaScience", "6,000 words",
                 "selfplay.use_corpus: false"):
        assert part in message, part
    with pytest.raises(RunDirError, match="Nemotron"):
        check_real_corpus(_config(paths, domain="tool_use", k=8))


def test_require_real_accepts_a_real_corpus_and_the_no_corpus_ablation(tmp_path):
    check_real_corpus(_config([_real(tmp_path)]))
    check_real_corpus(from_dict({"corpus": {"paths": [DEMO], "require_real": True}, "selfplay": {"use_corpus": False}}))


def test_paper_recipes_require_a_real_corpus_without_the_key(tmp_path):
    recipe = tmp_path / "examples" / "recipes" / "paper" / "games_30b.yaml"
    assert paper_recipe(recipe) and not paper_recipe(ROOT / "examples" / "recipes" / "qwen3_4b_games.yaml")
    plain = from_dict({"corpus": {"paths": [DEMO]}, "selfplay": {"use_corpus": True}})
    with pytest.raises(RunDirError, match="demo corpus"):
        check_real_corpus(plain, recipe)


def test_the_key_is_validated():
    with pytest.raises(ConfigError, match=r"corpus\.require_real: expected true or false"):
        from_dict({"corpus": {"require_real": "yes"}})


def test_spade_train_check_refuses(tmp_path):
    config = tmp_path / "repro.yaml"
    config.write_text(f"include: {ROOT / 'examples' / 'smoke_cpu.yaml'}\n"
                      f"corpus: {{paths: [{DEMO}], require_real: true}}\nselfplay: {{use_corpus: true}}\n")
    proc = prewarmed.run(["train", "--config", str(config), "--check"], cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "demo corpus" in proc.stderr, proc.stderr
    smoke = prewarmed.run(["train", "--config", str(ROOT / "examples" / "smoke_cpu.yaml"), "--check"], cwd=ROOT,
                          timeout=120)
    assert smoke.returncode == 0, smoke.stderr
