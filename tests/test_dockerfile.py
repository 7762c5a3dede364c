"""The Dockerfile's stages, read as BuildKit reads them (no Docker here, so nothing is built).

What is checked: Transformer Engine compiles in a stage of its own, right after the base and before
anything else is built, so `docker build --target te .` tries the least tested pairing (TE 2.11 on
SGLang's torch) alone; the final stage installs the wheels the build stages made instead of
compiling again; and every build argument a stage expands is declared in that stage (an ARG
declared before the first FROM is visible to FROM lines only, a mistake that passes any reading
but an actual build).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TE_SOURCE = "github.com/NVIDIA/TransformerEngine"
APEX_SOURCE = "github.com/NVIDIA/apex"
HEREDOC = re.compile(r"<<-?(['\"]?)(\w+)\1")
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class Instruction:
    keyword: str
    text: str  # the instruction's line(s), continuation backslashes joined
    expanded_body: str = ""  # bodies of unquoted heredocs: the shell expands ${...} in them


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def declared(self, env_only: bool = False) -> set[str]:
        names = set()
        for instruction in self.instructions:
            if instruction.keyword == "ARG" and not env_only:
                names.add(instruction.text.split()[1].split("=")[0])
            elif instruction.keyword == "ENV":
                names.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", instruction.text))
        return names


def read_dockerfile(path: Path) -> tuple[list[Instruction], list[Stage]]:
    """The instructions before the first FROM, and the stages."""
    lines = path.read_text().splitlines()
    preamble: list[Instruction] = []
    stages: list[Stage] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        text = line
        while text.endswith("\\") and i < len(lines):
            text = text[:-1] + " " + lines[i].strip()
            i += 1
        body = []
        for quote, delimiter in HEREDOC.findall(text):
            while i < len(lines) and lines[i].strip() != delimiter:
                if not quote:
                    body.append(lines[i])
                i += 1
            i += 1
        instruction = Instruction(text.split()[0].upper(), text, "\n".join(body))
        if instruction.keyword == "FROM":
            words = text.split()
            name = words[3] if len(words) > 3 and words[2].upper() == "AS" else f"stage{len(stages)}"
            stages.append(Stage(base=words[1], name=name))
        elif stages:
            stages[-1].instructions.append(instruction)
        else:
            preamble.append(instruction)
    return preamble, stages


def _ancestors(stage: Stage, by_name: dict[str, Stage]) -> list[Stage]:
    chain = [stage]
    while chain[-1].base in by_name:
        chain.append(by_name[chain[-1].base])
    return chain


def test_transformer_engine_builds_alone_in_the_first_stage_after_the_base():
    _, stages = read_dockerfile(ROOT / "Dockerfile")
    names = [stage.name for stage in stages]
    builds_te = [stage.name for stage in stages if any(TE_SOURCE in i.text for i in stage.instructions)]
    assert builds_te == ["te"], "Transformer Engine must compile in one stage named te"
    te = stages[names.index("te")]
    assert te.base == stages[0].name and names.index("te") == 1, "te builds on the base and comes right after it"
    builds_apex = [stage.name for stage in stages if any(APEX_SOURCE in i.text for i in stage.instructions)]
    assert builds_apex == ["apex"] and names.index("apex") > names.index("te")
    final = stages[-1]
    mounts = set(re.findall(r"--mount=type=bind,from=(\w+)", " ".join(i.text for i in final.instructions)))
    assert mounts == {"te", "apex"}, "the final stage installs the wheels built by te and apex"
    assert _ancestors(final, {s.name: s for s in stages})[-1] is stages[0]


def test_every_build_argument_a_stage_expands_is_declared_in_it():
    preamble, stages = read_dockerfile(ROOT / "Dockerfile")
    global_args = {i.text.split()[1].split("=")[0] for i in preamble if i.keyword == "ARG"}
    by_name = {stage.name: stage for stage in stages}
    build_args = global_args | {name for stage in stages for name in stage.declared()}
    for stage in stages:
        assert set(VARIABLE.findall(stage.base)) <= global_args, f"FROM {stage.base}: only global ARGs"
        # ENV is inherited by the stages built on this one; ARG is not, hence the redeclarations
        visible = stage.declared() | {name for s in _ancestors(stage, by_name)[1:] for name in s.declared(env_only=True)}
        for instruction in stage.instructions:
            used = set(VARIABLE.findall(instruction.text + "\n" + instruction.expanded_body)) & build_args
            missing = used - visible
            assert not missing, f"stage {stage.name}: {instruction.text[:60]}... expands {missing} without ARG"
