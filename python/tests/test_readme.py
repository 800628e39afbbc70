"""The README's Python examples, run as written against a real server (only the address
changes)."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from pathlib import Path

import pytest
from conftest import Server

README = Path(__file__).resolve().parents[2] / "README.md"


def examples(heading: str = "## Use it from Python") -> list[str]:
    text = README.read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_has_four_python_examples_and_one_of_search() -> None:
    assert len(examples()) == 4
    assert len(examples("## Search")) == 1


@pytest.mark.parametrize("index", range(5))
def test_a_readme_example_runs(server: Server, index: int) -> None:
    code = (examples() + examples("## Search"))[index].replace("http://127.0.0.1:7070", server.url)
    # A module of its own, as a script would be: frameworks resolve type hints through
    # `sys.modules[cls.__module__]`.
    module = types.ModuleType(f"readme_example_{index + 1}")
    sys.modules[module.__name__] = module
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"README example {index + 1}", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    # Each `print(…)  # shown` line prints one line, and what the README shows is what it
    # printed, character for character.
    shown = [
        m.group(1) if (m := re.search(r"\)  # (.*)$", line)) else None
        for line in code.splitlines()
        if line.lstrip().startswith("print(")
    ]
    lines = printed.getvalue().splitlines()
    assert len(lines) == len(shown), (lines, shown)
    assert all(s is not None for s in shown), f"a print without its output shown: {shown}"
    for got, want in zip(lines, shown, strict=True):
        assert got == want
