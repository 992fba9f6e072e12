"""Settings are declared once (``Config``): the flags, the variables and the README agree."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from tidal.server.config import Config, duration, env, flag

from .conftest import ServerProcess

README = Path(__file__).parent.parent / "README.md"


def readme_settings() -> dict[str, tuple[str, str]]:
    """flag -> (variable, default) from README's Configuration table."""
    table: dict[str, tuple[str, str]] = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`--"):
            flags = re.findall(r"`(--[a-z-]+)`", cells[0])
            variables = re.findall(r"`(TIDAL_[A-Z_]+)", cells[1])
            for name, variable in zip(flags, variables, strict=True):
                table[name] = (variable, cells[2].strip("`"))
    return table


def test_every_setting_is_in_the_readme_with_its_variable_and_default() -> None:
    table = readme_settings()
    for f in fields(Config):
        assert flag(f.name) in table, f"README's Configuration table lacks {flag(f.name)}"
        variable, default = table[flag(f.name)]
        assert variable == env(f.name), (flag(f.name), variable)
        if f.default is None or f.default is False:
            assert default in ("none", "off"), (flag(f.name), default)
        elif f.metadata["kind"] == "duration":  # shown as written: 30d
            assert duration(default) == f.default, (flag(f.name), default, f.default)
        elif isinstance(f.default, int | float) and not isinstance(f.default, bool):
            assert float(default) == f.default, (flag(f.name), default, f.default)
        else:
            assert default == f.default, (flag(f.name), default, f.default)
    client_only = {"--token-file"}
    assert set(table) - {flag(f.name) for f in fields(Config)} == client_only


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--checkpoint-signals", "3"), "checkpoint_signals=3"),
        (("--shutdown-timeout", "4.5"), "shutdown_timeout=4.5"),
        (("--idempotency-max-keys", "7"), "idempotency_max_keys=7"),
    ],
)
async def test_settings_the_docs_name_reach_the_server(
    db_path: Path, extra: tuple[str, ...], expected: str
) -> None:
    """Before, five of them were in the docs but never passed from the command line."""
    proc = await ServerProcess(db_path, *extra, "--log-level", "debug").start()
    try:
        assert any(expected.encode() in line for line in proc.log), b"".join(proc.log)
    finally:
        await proc.stop()
