"""``tidal serve`` as a child process, ready once it logs ``listening on HOST:PORT``.

The one reader of that line: the tests and ``make bench`` start servers through it.
"""

from __future__ import annotations

import re
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Final

#: what ``tidal serve`` logs once it answers (``--port 0`` names the port it got)
LISTENING: Final = re.compile(r"listening on (\S+):(\d+)")


def listening_port(line: str | bytes) -> int | None:
    """The port a ``listening on`` log line names, or None for any other line."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    match = LISTENING.search(text)
    return int(match.group(2)) if match else None


@dataclass
class Child:
    """A process started with ``start``: its port, once ready, and its stderr lines."""

    proc: subprocess.Popen[str]
    port: int
    log: list[str] = field(default_factory=list)

    def rss_kib(self) -> int:
        """Resident memory now, from /proc (Linux)."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def start(cmd: list[str]) -> Child:
    """Run ``cmd`` and wait for its ``listening on`` line; stderr is read from then on by a
    thread, so the child never blocks on a full pipe."""
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    log: list[str] = []
    for line in proc.stderr:
        log.append(line)
        port = listening_port(line)
        if port is not None:
            threading.Thread(target=log.extend, args=(proc.stderr,), daemon=True).start()
            return Child(proc, port, log)
    raise RuntimeError(f"{cmd[0]} exited with {proc.wait()} before it was ready:\n{''.join(log)}")
