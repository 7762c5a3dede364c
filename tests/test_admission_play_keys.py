"""The ``selfplay.admission`` and ``selfplay.plays`` records and the flat keys they replaced.

A config written before the records (``selfplay.admission_probes``, ``degenerate_threshold``, the
``tool_admission`` section, ``max_concurrent_episodes``, ``agent_sample_form``, ...), whether a file,
an override or a run's config snapshot, still loads to the same values, with one warning per old key
naming its new place; a key given both ways is refused. (tests/test_sampling_keys.py does the same
for ``selfplay.sampling``, and checks that no config under examples/ uses a flat key.)"""

from __future__ import annotations

import dataclasses
import logging
import typing
from pathlib import Path

import pytest
import yaml

from spade.config import ConfigError
from spade.selfplay.admission_settings import MOVED_ADMISSION_KEYS, AdmissionSettings
from spade.selfplay.plays.play_rules import MOVED_PLAY_KEYS, PlayRules
from spade.selfplay.settings import SelfPlaySettings
from spade.train_config import from_dict, load_train_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# Each record: the selfplay keys as spade wrote them before it (every value off its default), the
# same in the new layout, and two of the lines the old keys log.
RECORDS = {
    "admission": dict(
        table=MOVED_ADMISSION_KEYS,
        flat="""
selfplay:
  k: 2
  admission_timeout_s: 30.0
  admission_smoke_test: released
  admission_determinism: false
  admission_probes: false
  degenerate_threshold: 0.7
  degenerate_probe_steps: 900
  degenerate_probe_seeds: 5
  winnability_gate: true
  winnability_unproven: reject
  require_reference_policy: true
  reference_min_return: 0.8
  admission_paper_exact: true
  tool_admission: {schema_gate: false, min_tools: 2}
""",
        nested="""
selfplay:
  k: 2
  admission:
    timeout_s: 30.0
    smoke_test: released
    determinism: false
    probes: false
    probe_threshold: 0.7
    probe_steps: 900
    probe_seeds: 5
    winnability_gate: true
    winnability_unproven: reject
    reference_policy: true
    reference_min_return: 0.8
    paper_exact: true
    tool_use: {schema_gate: false, min_tools: 2}
""",
        lines=("selfplay.degenerate_threshold is now selfplay.admission.probe_threshold",
               "selfplay.tool_admission is now selfplay.admission.tool_use"),
        override=(["selfplay.admission_probes=true", "selfplay.tool_admission.model_screen=false"],
                  ["selfplay.admission.probes=true", "selfplay.admission.tool_use.model_screen=false"])),
    "plays": dict(
        table=MOVED_PLAY_KEYS,
        flat="""
selfplay:
  k: 2
  max_concurrent_episodes: 5
  max_play_retries: 1
  keep_trajectories: 0
  agent_sample_form: per_turn
  drop_equal_return_groups: true
  refill_equal_groups: 2
  mask_truncated: true
  tool_mask_malformed_calls: false
  plays: {env_faults: retry_then_drop}
""",
        nested="""
selfplay:
  k: 2
  plays:
    max_concurrent: 5
    max_retries: 1
    keep_trajectories: 0
    sample_form: per_turn
    drop_equal_return_groups: true
    refill_equal_groups: 2
    mask_truncated: true
    tool_mask_malformed_calls: false
    env_faults: retry_then_drop
""",
        lines=("selfplay.max_concurrent_episodes is now selfplay.plays.max_concurrent",
               "selfplay.agent_sample_form is now selfplay.plays.sample_form"),
        override=(["selfplay.max_concurrent_episodes=3", "selfplay.mask_truncated=false"],
                  ["selfplay.plays.max_concurrent=3", "selfplay.plays.mask_truncated=false"])),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_a_config_with_the_flat_keys_loads_as_the_new_layout(tmp_path, caplog, record):
    r = RECORDS[record]
    with caplog.at_level(logging.WARNING, logger="spade.config"):
        old = load_train_config(_write(tmp_path / "old.yaml", r["flat"]))
    new = load_train_config(_write(tmp_path / "new.yaml", r["nested"]))
    assert old == new and getattr(new.selfplay, record) != getattr(SelfPlaySettings(), record)
    assert len(caplog.messages) == len(r["table"])  # one line for each old key
    for line in r["lines"]:
        assert line in caplog.messages


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_an_old_key_in_an_override_loads_at_its_new_place(record):
    """Over a recipe that writes the record's new keys (paper/tool_use_base.yaml: admission.probes
    false, admission.tool_use.model_screen true, plays.mask_truncated true), an old key given on the
    command line overrides the value beneath it, as the new key does; the keys beside it stay."""
    old, new = RECORDS[record]["override"]
    recipe = EXAMPLES / "recipes" / "paper" / "tool_use_base.yaml"
    config = load_train_config(recipe, old)
    assert config == load_train_config(recipe, new) != load_train_config(recipe)
    assert config.selfplay.admission.tool_use.min_tools == 3 and not config.selfplay.admission.tool_use.schema_gate
    assert config.selfplay.plays.tool_mask_malformed_calls and config.selfplay.plays.env_faults == "retry_then_drop"


def _old_snapshot(config) -> dict:
    """``config``'s run snapshot as spade wrote it before the two records: their keys flat."""
    data = config.to_dict()
    selfplay = data["selfplay"]
    admission = selfplay.pop("admission")
    plays = selfplay["plays"]
    for table, source in ((MOVED_ADMISSION_KEYS, admission), (MOVED_PLAY_KEYS, plays)):
        for old, new in table.items():
            selfplay[old] = source.pop(new.split(".", 1)[1])
    return data


@pytest.mark.parametrize("recipe", ["recipes/paper/games_base.yaml", "recipes/paper/tool_use_4b.yaml",
                                    "smoke_cpu.yaml"])
def test_a_run_whose_snapshot_has_the_flat_keys_resumes(tmp_path, capsys, monkeypatch, recipe):
    from spade.cli import main
    from spade.run.run_dir import RunDir

    monkeypatch.setattr("spade.run.preflight.preflight", lambda config: None)  # a GPU recipe's model paths
    config = load_train_config(EXAMPLES / recipe)
    run = RunDir(tmp_path / "old")
    run.create(yaml.safe_dump(_old_snapshot(config), sort_keys=False))
    text = run.config_path.read_text()
    assert "admission_probes" in text and "max_concurrent_episodes" in text and "\n  admission:" not in text
    assert main(["train", "--resume", str(run.root), "--check"]) == 0
    assert from_dict(yaml.safe_load(capsys.readouterr().out)) == config


def test_a_setting_given_both_ways_is_an_error_naming_both():
    with pytest.raises(ConfigError, match=r"selfplay\.admission_probes and selfplay\.admission\.probes "
                                          r"are the same setting"):
        from_dict({"selfplay": {"admission_probes": False, "admission": {"probes": True}}})
    with pytest.raises(ConfigError, match=r"selfplay\.mask_truncated and selfplay\.plays\.mask_truncated"):
        from_dict({"selfplay": {"mask_truncated": True, "plays": {"mask_truncated": False}}})


def test_errors_name_the_full_new_key():
    with pytest.raises(ConfigError, match=r"selfplay\.admission\.probe_seeds: must be an integer from 1 to 64"):
        from_dict({"selfplay": {"admission": {"probe_seeds": 0}}})
    with pytest.raises(ConfigError, match=r"selfplay\.admission\.probe_seeds: must be an integer from 1 to 64"):
        from_dict({"selfplay": {"degenerate_probe_seeds": 0}})  # given by its old name too
    with pytest.raises(ConfigError, match=r"selfplay\.plays\.max_concurrent: must be an integer >= 1"):
        from_dict({"selfplay": {"plays": {"max_concurrent": 0}}})
    with pytest.raises(ConfigError, match=r"selfplay\.plays\.sample_form: 'turns' is not allowed"):
        from_dict({"selfplay": {"agent_sample_form": "turns"}})


def test_the_tables_name_every_old_key_and_land_on_a_field():
    assert set(MOVED_ADMISSION_KEYS) == {
        "admission_timeout_s", "admission_smoke_test", "admission_determinism", "admission_probes",
        "degenerate_threshold", "degenerate_probe_steps", "degenerate_probe_seeds", "winnability_gate",
        "winnability_unproven", "require_reference_policy", "reference_min_return", "admission_paper_exact",
        "tool_admission"}
    assert set(MOVED_PLAY_KEYS) == {
        "max_concurrent_episodes", "max_play_retries", "keep_trajectories", "agent_sample_form",
        "drop_equal_return_groups", "refill_equal_groups", "mask_truncated", "tool_mask_malformed_calls"}
    hints = typing.get_type_hints(SelfPlaySettings)
    flat = {field.name for field in dataclasses.fields(SelfPlaySettings)}
    for table, cls in ((MOVED_ADMISSION_KEYS, AdmissionSettings), (MOVED_PLAY_KEYS, PlayRules)):
        for old, new in table.items():
            section, name = new.split(".")
            assert hints[section] is cls and name in {f.name for f in dataclasses.fields(cls)}, new
            assert old not in flat  # the old key is no field any more: only the table loads it
    # the defaults did not move with the keys
    assert SelfPlaySettings().admission == AdmissionSettings() and SelfPlaySettings().plays == PlayRules()
    assert (AdmissionSettings().timeout_s, AdmissionSettings().probe_threshold, PlayRules().max_concurrent,
            PlayRules().max_retries, PlayRules().keep_trajectories) == (60.0, 0.5, 64, 3, 4)
