"""Minimal safetensors reader/writer on numpy + ml_dtypes (bfloat16 included).

The reader memory-maps the file and validates the header against the file size, so a
truncated download is a clear `CheckpointError` naming the file, not a crash later.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from jaxspec.errors import CheckpointError

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Tensors of one file as read-only numpy views of a memory map (no copy until used)."""
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise CheckpointError(f"{path} is truncated ({size} bytes); re-download or re-save it")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    (header_len,) = struct.unpack("<Q", buf[:8])
    if 8 + header_len > size:
        raise CheckpointError(f"{path} is truncated: header needs {header_len} bytes, file has {size - 8}; re-download it")
    try:
        header = json.loads(bytes(buf[8:8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not a safetensors file (bad header: {e})") from None
    header.pop("__metadata__", None)
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        start, end = info["data_offsets"]
        if base + end > size:
            raise CheckpointError(
                f"{path} is truncated: tensor {name!r} ends at byte {base + end}, file has {size}; re-download it"
            )
        shape = tuple(info["shape"])
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if end - start != expected:
            raise CheckpointError(f"{path}: tensor {name!r} has {end - start} bytes for shape {shape} ({expected} expected)")
        tensors[name] = np.frombuffer(buf, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)),
                                      offset=base + start).reshape(shape)
    return tensors


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write atomically (temp file + rename) so an interrupted save never leaves a torn file."""
    path = Path(path)
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    arrays = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        if arr.dtype not in _NAMES:
            raise CheckpointError(f"cannot save tensor {name!r} of dtype {arr.dtype}")
        header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep tensor data 8-byte aligned
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.tobytes())
    tmp.replace(path)
