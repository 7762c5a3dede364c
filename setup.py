"""spade: self-play in executable environments that a model writes for itself."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def pinned_requirements() -> dict[str, list[str]]:
    """requirements.txt, split at its '# <section>' comments: the first block is what spade needs."""
    sections: dict[str, list[str]] = {"install": []}
    current = "install"
    for line in (HERE / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if line.startswith("# ") and len(line.split()) == 2:
            current = line[2:]
            sections.setdefault(current, [])
        elif line and not line.startswith("#"):
            sections[current].append(line)
    return sections


REQUIREMENTS = pinned_requirements()


setup(
    name="spade",
    version="0.1.0",
    description="Self-play RL in environments the model writes itself (SPADE), on Megatron-core",
    python_requires=">=3.10",
    packages=find_packages(include=["spade", "spade.*", "megatron_patches", "megatron_patches.*"]),
    package_data={"spade.envs.sandbox": ["runtime/*.py"], "spade.eval": ["data/*.json", "drivers/*.py"],
                  "spade.analysis": ["explorer_assets/*"]},
    install_requires=REQUIREMENTS.pop("install"),
    extras_require=REQUIREMENTS,
    entry_points={"console_scripts": ["spade=spade.cli:main"]},
)
