"""The hot modules compiled with mypyc, as mypy and black ship theirs; pure Python otherwise.

Everything else about the package is in pyproject.toml. The signal path runs through
these modules for every request; compiled, the server spends 20-30% less CPU
per signal (docs/BENCHMARKS.md). They are plain, strictly typed Python either way:
without a C compiler, or with TIDAL_PURE=1, the same code runs interpreted.

mypyc names a module by its path, and the sources live in server/ and protocol/ for
the import names tidal.server and tidal.protocol, so it reads them through a tree of
links laid out as they are imported (as ``make lint`` does for mypy).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from setuptools import setup

ROOT = Path(__file__).resolve().parent

#: Kept interpreted: storage and the modules tests reach into (their constants are
#: patched, which compiled code would not see), app, and everything off the hot path.
COMPILED = {
    "protocol": ["framing", "connection", "headers", "messages", "outcomes", "partitions"],
    "server/net": ["connection", "flow", "outgoing"],
    "server/core": [
        "aggregates", "asks", "batch", "board", "budget", "chunks", "cohorts", "counts", "keys",
        "ledger", "matching", "members", "order", "orders", "owners", "params", "parts", "past",
        "ranking", "reload", "replies", "restore", "signals", "sliding", "sums", "tallies",
        "windows",
    ],
    "server/engine": [
        "changes", "committer", "cycle", "delivery", "engine", "health", "outage",
        "participants", "ranked", "reads", "signalling",
    ],
}  # fmt: skip
PACKAGES = ("server", "protocol", "client", "cli", "testing")


def can_compile() -> bool:
    """A C compiler, and Python's headers (Debian keeps them apart, in python3-dev)."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.c"
        probe.write_text("#include <Python.h>\nint probe(void) { return 0; }\n")
        include = sysconfig.get_paths()["include"]
        done = subprocess.run(
            [*cc, "-c", str(probe), "-I", include, "-o", str(Path(tmp) / "probe.o")],
            capture_output=True,
        )
    return done.returncode == 0


def compiled_modules() -> list[Any]:
    """The compiled modules, or none (pure Python). With TIDAL_COMPILE=required (the image's
    build stage), a build that cannot compile fails rather than ship pure Python unseen."""
    required = os.environ.get("TIDAL_COMPILE") == "required"
    if os.environ.get("TIDAL_PURE"):
        return []
    if not can_compile():
        if required:
            sys.exit("tidal: TIDAL_COMPILE=required, but no C compiler and Python headers here")
        print("tidal: cannot compile C extensions here: installing pure Python", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        if required:
            sys.exit("tidal: TIDAL_COMPILE=required, but mypyc is not available")
        print("tidal: mypyc is not available: installing pure Python", file=sys.stderr)
        return []
    tree = ROOT / "build" / "mypyc-src"
    (tree / "tidal").mkdir(parents=True, exist_ok=True)
    for package in PACKAGES:
        link = tree / "tidal" / package
        if not link.is_symlink():
            link.symlink_to(ROOT / package, target_is_directory=True)
    compiled = [f"tidal/{pkg}/{name}.py" for pkg, names in COMPILED.items() for name in names]
    # every module named, so that mypy reads them all here, never an installed tidal
    every = sorted(
        f"tidal/{path.relative_to(ROOT)}" for pkg in PACKAGES for path in (ROOT / pkg).rglob("*.py")
    )
    here = os.getcwd()
    os.chdir(tree)  # mypyc takes module names from paths relative to here
    try:
        return list(
            mypycify(
                ["--config-file", str(ROOT / "pyproject.toml"), "--explicit-package-bases", *every],
                only_compile_paths=compiled,
                target_dir=str(ROOT / "build" / "mypyc"),
                opt_level="3",
            )
        )
    finally:
        os.chdir(here)


setup(ext_modules=compiled_modules())
