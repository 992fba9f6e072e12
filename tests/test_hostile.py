"""Hostile clients, all at once, while an honest one keeps its latency and memory stays bounded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from pathlib import Path

import msgpack

from .conftest import ServerProcess, signal_p99

ROUNDS = int(os.environ.get("TIDAL_HOSTILE_ROUNDS", "3"))
CLOSE = -1
#: name -> (bytes sent, what the server must do: CLOSE, or answer this many errors and go on)
ATTACKS: dict[str, tuple[bytes, int]] = {
    "array of 2**32-1": (b"\xdd\xff\xff\xff\xff" + b"\x00" * 1000, CLOSE),
    "string of 1 GiB": (
        b"\x94\x00\x01\xa6signal\x91\xdb\x40\x00\x00\x00" + b"a" * (9 << 20),
        CLOSE,
    ),
    "nesting 2000 deep": (b"\x91" * 2000, CLOSE),
    "byte 0xc1": (b"\xc1", CLOSE),
    "9 MiB message": (
        msgpack.packb([0, 5, "signal", [1, "e", "k", 1.0, {"x": "y" * (9 << 20)}]]),
        CLOSE,
    ),
    "not an array": (msgpack.packb({"method": "leave"}), CLOSE),
    "batch of 10,001": (msgpack.packb([0, 6, "signal_batch", [[[1, "e", "k"]] * 10_001]]), 1),
    "wrong types": (
        b"".join(
            msgpack.packb([0, i, "signal", params])
            for i, params in enumerate(
                [
                    [None, "e", "k"],
                    [1, 2, "k"],
                    [1, "e", None],
                    [1, "e", "k", "w"],
                    [1, "e", "k", 1, 5],
                ]
            )
        ),
        5,
    ),
}


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match
    return int(match.group(1))


async def attack(port: int, payload: bytes, outcome: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    unpacker = msgpack.Unpacker()
    errors = 0
    with contextlib.suppress(ConnectionError):
        writer.write(payload)
        await writer.drain()
        while outcome == CLOSE or errors < outcome:
            data = await reader.read(65536)
            if not data:
                break
            unpacker.feed(data)
            for reply in unpacker:
                assert reply[0] in (1, 2) and reply[2] is not None, reply  # errors only
                errors += 1
    assert outcome == CLOSE or errors == outcome, (outcome, errors)
    if outcome == CLOSE:
        assert reader.at_eof() or writer.is_closing()
    writer.close()


async def test_hostile_inputs_leave_honest_clients_and_memory_alone(db_path: Path) -> None:
    # a message that announces more than can come stalls; it is closed after 3 s
    proc = ServerProcess(db_path, "--message-timeout", "3")
    await proc.start()
    assert proc.proc is not None
    try:
        async with await proc.connect() as honest:
            baseline = await signal_p99(honest, 300)
            rss: list[int] = []
            for _ in range(ROUNDS):
                attacks = [
                    asyncio.create_task(
                        asyncio.wait_for(attack(proc.port, payload, outcome), 60), name=name
                    )
                    for name, (payload, outcome) in ATTACKS.items()
                ]
                loaded = await signal_p99(honest, 300)
                for task in attacks:
                    await task
                rss.append(rss_kib(proc.proc.pid))
                assert loaded <= max(2 * baseline, baseline + 0.02), (baseline, loaded)
            assert await honest.ping() == "pong"
        print(f"honest p99 {baseline * 1000:.2f} ms alone; server RSS after rounds: {rss} KiB")
        # bounded: what one round of attacks leaves behind, later rounds do not add to
        assert rss[-1] - rss[1] < 32 * 1024, rss
    finally:
        await proc.stop()
