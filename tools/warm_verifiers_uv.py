"""Fill .venv-verifiers' uv cache with the packages of verifiers' chat program (``make verifiers``).

Run with .venv-verifiers' python and spade on PYTHONPATH. It prepares the script environment the
way verifiers' runtime does (``uv sync --script``, then ``uv python find --script``), under the
settings of ``spade.envs.verifiers_uv``, so rollouts later install from the cache.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

from spade.envs.verifiers_uv import uv_environment


def main() -> None:
    venv = Path(sys.prefix)
    env = uv_environment(venv)
    with tempfile.TemporaryDirectory() as directory:
        script = Path(directory) / "chat_program.py"
        script.write_text(CHAT_PROGRAM_SOURCE, encoding="utf-8")
        for command in (["uv", "sync", "--script", str(script), "-q", "--no-config"],
                        ["uv", "python", "find", "--script", str(script), "--no-config"]):
            subprocess.run(command, env=env, check=True)
    print(f"uv cache ready: {env['UV_CACHE_DIR']}")


if __name__ == "__main__":
    main()
