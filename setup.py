"""spade: self-play in executable environments that a model writes for itself."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def pinned_requirements() -> list[str]:
    lines = (HERE / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


setup(
    name="spade",
    version="0.1.0",
    description="Self-play RL in environments the model writes itself (SPADE), on Megatron-core",
    python_requires=">=3.10",
    packages=find_packages(include=["spade", "spade.*", "megatron_patches", "megatron_patches.*"]),
    package_data={"spade.envs.sandbox": ["runtime/*.py"]},
    install_requires=pinned_requirements(),
    entry_points={"console_scripts": ["spade=spade.cli:main"]},
)
