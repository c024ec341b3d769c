"""Every fenced Python block of README.md runs as written (and any block of docs/*.md that follows a
`<!-- runnable -->` line): the snippets a new user copies first. Each block runs on its own, in a fresh namespace,
on the CPU (the "auto" backend is then the PyTorch reference)."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCE = re.compile(r"(<!-- runnable -->\s*\n)?```python\n(.*?)```", re.S)


def _blocks():
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for i, m in enumerate(FENCE.finditer(text)):
            if path.name == "README.md" or m.group(1):
                line = text[:m.start()].count("\n") + 1
                found.append(pytest.param(m.group(2), id=f"{path.name}:{line}"))
    return found


BLOCKS = _blocks()


def test_readme_has_its_python_blocks():
    assert len([b for b in BLOCKS if b.id.startswith("README")]) >= 4


@pytest.mark.parametrize("code", BLOCKS)
def test_block_runs_as_written(code):
    import torch
    torch.manual_seed(0)
    exec(compile(code, "<readme>", "exec"), {"__name__": "__readme__"})
