"""Helpers shared by the tests (tests/ is on sys.path through tests/conftest.py):

- ``support.models``: the one builder of tiny random Qwen3 models (``tiny_qwen3``, ``save_tiny_qwen3``)
  and the ``model_dir`` fixture family (``tiny_hf_dir_fixture``);
- ``support.configs``: run configs written from a dict (``write_config``), not f-string YAML;
- ``support.http``: hand-rolled HTTP fakes (a local server answering from a handler);
- ``support.two_seat_games``: hand-written designed two-seat games (an honest TicTacToe and broken variants);
- ``support.paths``: the test folders (tests/ and tests/<package>/), all put on sys.path.
"""
