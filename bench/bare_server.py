"""The bare stack limit: a MessagePack-RPC server on uvloop that does no work but reply.

It decodes each request and answers it with a result shaped like tidal's
(``{"seq": n, "forwarded": true}``), in one write per chunk of input, so the
gap between it and tidal is what tidal's own work costs. The reads ``tidal bench``
makes before its clock starts are answered as an empty tidal would (``EMPTY``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, cast

import msgpack
import uvloop

EMPTY: dict[str, Any] = {  # what an empty tidal answers to the set-up's reads
    "cohorts": {"cohorts": {}, "more": None},
    "stats": {"ledger_rows": 0, "signals": 0},
    "left_users": {"users": [], "next": None},
}


class Bare(asyncio.Protocol):
    def __init__(self) -> None:
        self.unpacker = msgpack.Unpacker(raw=False)
        self.packer = msgpack.Packer(use_bin_type=True)
        self.seq = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.unpacker.feed(data)
        out = []
        pack = self.packer.pack
        for message in self.unpacker:
            if message[0] != 0:
                continue
            self.seq += 1
            result: Any = {"seq": self.seq, "forwarded": True}
            if message[2] in EMPTY:
                result = EMPTY[message[2]]
            elif message[2] == "signal_batch":
                result = [result] * len(message[3][0])
            out.append(pack([1, message[1], None, result]))
        if out:
            self.transport.write(b"".join(out))


async def main(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Bare, host, port, reuse_address=True)
    print(f"listening on {host}:{server.sockets[0].getsockname()[1]}", file=sys.stderr, flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7412)
    args = parser.parse_args()
    uvloop.run(main(args.host, args.port))
