"""``spade eval --out DIR`` where DIR's parent does not exist yet (issue 28): the directory is made,
and a DIR that cannot be a directory is a usage error naming --out, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from spade.cli import main

from test_eval_runner import tiny_model  # noqa: F401 - the fixture

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"


def test_out_whose_parents_do_not_exist_is_created(tiny_model, tmp_path):
    out = tmp_path / "not" / "there" / "out"
    # aime26 has no data among the fixtures: skipped, so nothing but the summary is written
    code = main(["eval", "--model", str(tiny_model), "--benchmarks", "aime26", "--data", str(FIXTURES),
                 "--out", str(out), "--max-batch-size", "1"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["benchmarks"]["aime26"]["skipped"]


def test_out_under_a_file_is_a_usage_error(tiny_model, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code = main(["eval", "--model", str(tiny_model), "--benchmarks", "aime26", "--data", str(FIXTURES),
                 "--out", str(blocker / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--out" in err and "Traceback" not in err
