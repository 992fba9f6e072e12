"""README's examples, run in order on a fresh database: each exits cleanly, and each
``print`` prints what its comment says (the comment's text before any parenthesis,
``...`` matching anything), as a new user trying them would see."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from .conftest import ServerProcess

README = Path(__file__).parent.parent / "README.md"


def blocks(language: str, section: str) -> list[str]:
    """The code blocks of ``language`` in README's ``section``."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(rf"```{language}\n(.*?)```", text[start:end], re.DOTALL)


def expected(code: str) -> list[str]:
    """What each commented ``print`` line says it prints, as a pattern."""
    wanted = []
    for line in code.splitlines():
        if line.strip().startswith("print(") and "  # " in line:
            said = line.split("  # ", 1)[1].split(" (", 1)[0].strip()
            wanted.append(".*".join(re.escape(part) for part in said.split("...")))
    return wanted


async def test_readme_examples_do_what_their_comments_say(process: ServerProcess) -> None:
    await process.start()
    env = {**os.environ, "TIDAL_PORT": str(process.port)}
    for code in blocks("sh", "Talking to it"):
        for line in code.splitlines():
            if line.startswith(".venv/bin/tidal "):
                argv = [sys.executable, "-m", "tidal.cli", *shlex.split(line, comments=True)[1:]]
                done = await asyncio.to_thread(
                    subprocess.run, argv, env=env, capture_output=True, text=True, timeout=60
                )
                assert done.returncode == 0, (line, done.stderr)
    python = blocks("python", "Talking to it")
    assert len(python) == 2, "README's asyncio and blocking examples"
    for code in python:
        script = code.replace("7411", str(process.port))
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        printed = done.stdout.splitlines()
        wanted = expected(code)
        assert len(printed) == len(wanted), (printed, wanted)
        for line, pattern in zip(printed, wanted, strict=True):
            assert re.fullmatch(pattern, line), (line, pattern)
