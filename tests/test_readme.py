"""The examples in README and docs/, run as written, in order, against a real server on a
fresh database, as a newcomer following them to the letter would: every Python block
is a whole program that exits cleanly, and each of its commented ``print`` lines prints
what its comment says (the comment's text before any parenthesis, ``...`` matching
anything); every ``tidal`` command of a shell block exits 0. Shell lines that set up
another machine (make, containers, a cluster's nodes) are named here, so that a new kind
of line is noticed rather than skipped."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tidal.testing.postgres import free_port

from .conftest import ServerProcess

#: the HTTP port the examples name (``make run``'s): the test's own is put in its place
HTTP_PORT = "7480"

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: shell lines that are not run here: what they do is set up a machine, a container or a
#: node, which the tests of deploy/ and cluster mode do for real
ELSEWHERE = re.compile(
    r"(make|docker|podman|sudo|psql|patronictl)\b"
    r"|export TIDAL_TOKEN=|TIDAL_PYTHON_IMAGE=|DB=|TIDAL_HOST=tidal1|tidal serve "
    r"|\. \.venv/bin/activate"
)


def blocks(path: Path, language: str) -> list[str]:
    """The code blocks of ``language`` in a Markdown file, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.DOTALL | re.MULTILINE)


def expected(code: str, mark: str = "#") -> list[str]:
    """What each commented ``print`` (``console.log``) line says it prints, as a pattern."""
    wanted = []
    for line in code.splitlines():
        if line.strip().startswith(("print(", "console.log(")) and f"  {mark} " in line:
            said = line.split(f"  {mark} ", 1)[1].split(" (", 1)[0].strip()
            wanted.append(".*".join(re.escape(part) for part in said.split("...")))
    return wanted


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


async def test_every_example_runs_as_written(process: ServerProcess, tmp_path: Path) -> None:
    http = str(free_port())
    process.extra = (*process.extra, "--http", f"127.0.0.1:{http}")
    await process.start()
    env = {**os.environ, "TIDAL_PORT": str(process.port)}
    ran = 0
    for path in DOCS:
        for code in blocks(path, "sh"):
            for line in code.splitlines():
                command = line.split("  #", 1)[0].strip()
                if not command or command.startswith("#") or ELSEWHERE.match(command):
                    continue
                argv = shlex.split(command.replace(HTTP_PORT, http), comments=True)
                assert argv[0] in ("tidal", "curl"), (
                    f"{path.name}: a shell line this test does not know: {line}"
                )
                if argv[0] == "tidal":
                    argv = [sys.executable, "-m", "tidal.cli", *argv[1:]]
                done = await asyncio.to_thread(run, argv, tmp_path, env)
                # curl: a stream ends only when --max-time cuts it (exit 28), having printed
                cut = argv[0] == "curl" and "--max-time" in argv and done.returncode == 28
                assert done.returncode == 0 or (cut and "id: " in done.stdout), (
                    path.name,
                    line,
                    done.stderr,
                )
                if argv[0] == "curl" and not cut:
                    assert '"error"' not in done.stdout, (path.name, line, done.stdout)
                ran += 1
        for code in blocks(path, "js"):
            script = code.replace(HTTP_PORT, http)
            argv = ["node", "--input-type=module", "-e", script]
            done = await asyncio.to_thread(run, argv, tmp_path, env)
            assert done.returncode == 0, (path.name, code, done.stderr)
            printed, wanted = done.stdout.splitlines(), expected(code, "//")
            assert len(printed) == len(wanted), (path.name, code, printed, wanted)
            for line, pattern in zip(printed, wanted, strict=True):
                assert re.fullmatch(pattern, line), (path.name, line, pattern)
            ran += 1
        for code in blocks(path, "python"):
            script = code.replace("7411", str(process.port))
            done = await asyncio.to_thread(run, [sys.executable, "-c", script], tmp_path, env)
            assert done.returncode == 0, (path.name, code, done.stderr)
            printed, wanted = done.stdout.splitlines(), expected(code)
            assert len(printed) == len(wanted), (path.name, code, printed, wanted)
            for line, pattern in zip(printed, wanted, strict=True):
                assert re.fullmatch(pattern, line), (path.name, line, pattern)
            ran += 1
    assert ran >= 18, f"only {ran} examples found: is the README's form still read right?"
