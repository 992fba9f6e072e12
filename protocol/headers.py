"""What MessagePack headers announce, read without building anything: the framing's
proof, from a partial message's first bytes, that it cannot fit the size limit."""

from __future__ import annotations

from typing import Final

#: MessagePack's first bytes, by what follows them: how many bytes hold a length or a count,
#: and what it counts (elements of an array, pairs of a map, bytes of a str, bin or ext)
_COUNTED: Final = {
    0xC4: (1, "bytes"), 0xC5: (2, "bytes"), 0xC6: (4, "bytes"),  # bin
    0xC7: (1, "ext"), 0xC8: (2, "ext"), 0xC9: (4, "ext"),
    0xD9: (1, "bytes"), 0xDA: (2, "bytes"), 0xDB: (4, "bytes"),  # str
    0xDC: (2, "elements"), 0xDD: (4, "elements"), 0xDE: (2, "pairs"), 0xDF: (4, "pairs"),
}  # fmt: skip
#: the bytes after the first of a scalar, or of a fixext (its type, then its data)
_FIXED: Final = {
    0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,
    0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,
}  # fmt: skip


def announced(data: bytes, limit: int) -> tuple[int, str | None]:
    """Read the headers in ``data``, the start of a message or the rest of one from a
    header on: how far the whole headers (and the bodies they announce) reach, and what
    one of them announces past ``limit``, if one does. No container is tracked: every
    element's header follows its container's, so the headers are read in a line."""
    at, end = 0, len(data)
    while at < end:
        first = data[at]
        if first <= 0x7F or first >= 0xE0 or first in (0xC0, 0xC2, 0xC3) or first <= 0x9F:
            at += 1
        elif first <= 0xBF:  # fixstr
            at += 1 + (first & 0x1F)
        elif first in _FIXED:
            at += 1 + _FIXED[first]
        elif first in _COUNTED:
            width, what = _COUNTED[first]
            if at + 1 + width > end:
                break  # the rest of this header comes next time
            count = int.from_bytes(data[at + 1 : at + 1 + width], "big")
            least = 2 * count if what == "pairs" else count
            if least > limit:
                return at, f" (a header announces {count:,} {what})"
            at += 1 + width
            if what in ("bytes", "ext"):
                at += count + (what == "ext")
        else:  # 0xC1 is never used: the scanner says what is malformed
            break
    return at, None
