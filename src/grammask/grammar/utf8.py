"""UTF-8 helpers shared by the matcher and the pipeline (forced bytes, streamed text)."""
from __future__ import annotations

__all__ = ["utf8_prefix"]


def utf8_prefix(data: bytes) -> bytes:
    """``data`` without an incomplete UTF-8 sequence at its end (complete ones are kept)."""
    i = len(data)
    k = 0
    while i > 0 and k < 4 and (data[i - 1] & 0xC0) == 0x80:
        i -= 1
        k += 1
    if i > 0:
        lead = data[i - 1]
        need = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 1
        if need != k + 1:
            return data[: i - 1]
    return data
