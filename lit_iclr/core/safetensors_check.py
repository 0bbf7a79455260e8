"""A `.safetensors` file checked against its own header before a library maps it (a truncated copy is one line).

The format (https://huggingface.co/docs/safetensors): 8 bytes, a little-endian u64 N; N bytes of UTF-8 JSON mapping each
tensor name to {dtype, shape, data_offsets: [begin, end]} (offsets into the data that follows, plus an optional
`__metadata__`); then the data. A complete file is exactly 8 + N + max(end) bytes. Reading a truncated one fails deep
inside the loader ("incomplete metadata, file not fully covered") without naming the file.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from .errors import DatasetFormatError


def check_safetensors(path: str | Path, fix: str) -> None:
    """Raise `DatasetFormatError(path, problem, fix)` unless `path` is a complete safetensors file."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise DatasetFormatError(path, f"is not a safetensors file ({size} bytes, shorter than its 8-byte header size)", fix)
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise DatasetFormatError(path, f"is truncated or not safetensors: its header says {n} bytes of JSON, the file "
                                     f"holds {size - 8} after the size", fix)
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DatasetFormatError(path, f"has a garbled safetensors header ({type(e).__name__})", fix) from None
    if not isinstance(header, dict):
        raise DatasetFormatError(path, "has a safetensors header that is not a JSON object", fix)
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise DatasetFormatError(path, "has a safetensors header without valid data_offsets", fix) from None
    if 8 + n + end != size:
        raise DatasetFormatError(path, f"is truncated: its header needs {8 + n + end} bytes, the file has {size}"
                                 if size < 8 + n + end else f"has {size - 8 - n - end} bytes after its last tensor", fix)
