"""The README's install lines and CI's get CPU torch wherever they run: pip from the PyTorch
project's CPU index before anything that pulls torch (from PyPI it is the CUDA build), pixi
from conda-forge's pytorch-cpu; the quickstart stays two commands, and CI runs its second."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: What pulls torch: the extras that list it, directly or through another extra.
PULLS_TORCH = re.compile(r"\.?\[(?:[a-z,]*,)?(train|all|test|dev)(?:,[a-z,]*)?\]")


def commands(text: str) -> list[list[str]]:
    """Every pip install in ``text``'s console blocks and shell lines, as argument lists."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, re.DOTALL) or [text]:
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if line.lstrip().startswith("#"):
                continue
            line = re.sub(r"\s+#.*$", "", line.removeprefix("$ "))
            for part in re.split(r"&&|;", line):
                words = shlex.split(part)
                if "pip" in " ".join(words[:2]) and "install" in words[:3]:
                    found.append(words)
    return found


def assert_cpu_torch_first(installs: list[list[str]], where: str) -> None:
    cpu = False
    for words in installs:
        if any(w.startswith("torch") for w in words):
            assert "--index-url" in words, f"{where}: {' '.join(words)}"
            assert words[words.index("--index-url") + 1] == CPU_INDEX
            cpu = True
        elif any(PULLS_TORCH.fullmatch(w.strip('"')) for w in words):
            assert cpu, f"{where}: {' '.join(words)} pulls torch before CPU torch is in"


def test_the_readme_installs_cpu_torch_before_anything_pulls_torch() -> None:
    install = README.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    assert_cpu_torch_first(commands(install), "Install")
    quickstart = README.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"```console\n", quickstart)) == 2  # two commands, no more
    assert_cpu_torch_first(commands(quickstart), "Quickstart")


def test_ci_runs_the_readmes_test_command_with_cpu_torch() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    quickstart = README.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    second = re.findall(r"```console\n\$ (.*?)\n```", quickstart, re.DOTALL)[1]
    assert " ".join(second.split()) in " ".join(ci.replace("\\\n", " ").split())
    assert_cpu_torch_first(commands(ci), ".ci/run")
    assert 'pip", "install", "-q", "torch' not in (ROOT / ".ci/install_order.py").read_text()


def test_pixi_leads_with_cpu_torch() -> None:
    pixi = tomllib.loads((ROOT / "pixi.toml").read_text())
    assert "pytorch-cpu" in pixi["dependencies"]
    install = README.split("\n## Install\n", 1)[1]
    assert install.index("pytorch-cpu") < install.index("$ pip install")


def test_the_extras_that_pull_torch_say_so() -> None:
    install = README.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    for extra in ("train", "all"):
        (line,) = [x for x in install.splitlines() if f'pip install ".[{extra}]"' in x]
        assert "torch" in line.split("#", 1)[1]
    assert "CUDA build" in install
