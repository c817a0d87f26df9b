"""GGUF's binary header: the key/value metadata of a GGUF model file, read without the tensors.

Layout (little-endian): ``b"GGUF"``, version (u32, 2 or later), tensor count (u64), metadata count
(u64), then per entry a key (u64 length + UTF-8) and a typed value (u32 type; arrays are an element
type, a u64 count and the elements).
"""
from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from ...errors import TokenizerError

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path: str | os.PathLike, prefix: str = "tokenizer.") -> dict[str, Any]:
    """Key/value metadata of a GGUF file (only keys starting with ``prefix``), without the tensors.

    Reads just the header, so it is fast even for large model files (unlike ``gguf.GGUFReader``).
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TokenizerError(f"cannot open GGUF file {path}: {e}") from None
    with f:
        def read(fmt):
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise TokenizerError(f"truncated GGUF file {path}")
            return struct.unpack(fmt, data)[0]

        def read_str():
            n = read("<Q")
            data = f.read(n)
            if len(data) != n:
                raise TokenizerError(f"truncated GGUF file {path}")
            return data.decode("utf-8", errors="surrogateescape")

        def read_value(vtype, keep):
            if vtype == 8:
                return read_str()
            if vtype == 9:
                etype, count = read("<I"), read("<Q")
                if etype == 8:
                    if not keep:
                        for _ in range(count):
                            f.seek(read("<Q"), 1)
                        return None
                    return [read_str() for _ in range(count)]
                if etype in _GGUF_SCALARS:
                    fmt = _GGUF_SCALARS[etype]
                    size = struct.calcsize(fmt)
                    data = f.read(size * count)
                    if len(data) != size * count:
                        raise TokenizerError(f"truncated GGUF file {path}")
                    return np.frombuffer(data, dtype=np.dtype(fmt)).tolist() if keep else None
                return [read_value(etype, keep) for _ in range(count)]
            if vtype in _GGUF_SCALARS:
                return read(_GGUF_SCALARS[vtype])
            raise TokenizerError(f"unknown GGUF value type {vtype} in {path}")

        if f.read(4) != b"GGUF":
            raise TokenizerError(f"{path} is not a GGUF file")
        version = read("<I")
        if version < 2:
            raise TokenizerError(f"GGUF version {version} of {path} is not supported")
        read("<Q")  # tensor count
        n_kv = read("<Q")
        out: dict[str, Any] = {}
        for _ in range(n_kv):
            key = read_str()
            keep = key.startswith(prefix)
            value = read_value(read("<I"), keep)
            if keep:
                out[key] = value
        return out


__all__ = ["read_gguf_metadata"]
