"""A lean GGUF header reader: metadata as Python values, tensors as views of one read-only mmap.

gguf-py's GGUFReader keeps every metadata item as numpy arrays (a 128k-token vocabulary becomes ~400k small
arrays: seconds to parse and ~270 MB of RSS, more than the largest tensor's conversion needs). This reads the
same file format (versions 2 and 3, little-endian) with struct, keeping strings as str and number arrays as
one numpy array each; tensors are (name, GGMLQuantizationType, dims, byte view of the data).

Malformed input (bad magic, truncation, impossible counts, bad UTF-8 in a key, duplicate keys or tensors,
unknown types) raises ValueError naming the problem.
"""
from __future__ import annotations

import pathlib
import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUFValueType -> struct format of one scalar (8: string, 9: array)
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
         10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class GGUFTensor:
    """name, tensor_type (gguf.GGMLQuantizationType), shape (numpy uint64 dims, ne0 = K first, as gguf-py),
    n_elements, n_bytes, data (uint8 view of the mmapped bytes; shorter than n_bytes if the file is truncated)."""

    __slots__ = ("name", "tensor_type", "shape", "n_elements", "n_bytes", "data")

    def __init__(self, name, tensor_type, shape, n_elements, n_bytes, data):
        self.name, self.tensor_type, self.shape = name, tensor_type, shape
        self.n_elements, self.n_bytes, self.data = n_elements, n_bytes, data


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos, self.end = buf, 0, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.end:
            raise ValueError("truncated header")
        self.pos = start + n
        return start

    def u32(self) -> int:
        return _U32.unpack_from(self.buf, self.take(4))[0]

    def u64(self) -> int:
        return _U64.unpack_from(self.buf, self.take(8))[0]

    def raw_str(self) -> bytes:
        n = self.u64()
        start = self.take(n)
        return bytes(self.buf[start:start + n])

    def string(self) -> str:
        return self.raw_str().decode("utf-8", "replace")

    def value(self, vtype: int):
        if vtype in SCALAR:
            fmt = struct.Struct(SCALAR[vtype])
            return fmt.unpack_from(self.buf, self.take(fmt.size))[0]
        if vtype == STRING:
            return self.string()
        if vtype != ARRAY:
            raise ValueError(f"unknown metadata value type {vtype}")
        sub, count = self.u32(), self.u64()
        if sub == STRING:
            if count * 8 > self.end - self.pos:
                raise ValueError(f"string array of {count} items exceeds the file")
            return [self.string() for _ in range(count)]
        if sub == ARRAY:  # nested arrays: llama.cpp writes none; read them as lists
            if count > self.end - self.pos:
                raise ValueError(f"array of {count} arrays exceeds the file")
            return [self.value(ARRAY) for _ in range(count)]
        if sub not in NUMPY:
            raise ValueError(f"unknown array item type {sub}")
        dt = np.dtype(NUMPY[sub])
        start = self.take(count * dt.itemsize)
        return np.frombuffer(self.buf, dt, count, start).copy()


class GGUFFile:
    """Parses path's header; fields: key -> str / int / float / bool / list[str] / numpy array; tensors: list."""

    def __init__(self, path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = pathlib.Path(path)
        self.data = np.memmap(self.path, mode="r")
        cur = _Cursor(memoryview(self.data).cast("B"))
        if bytes(cur.buf[cur.take(4):4]) != GGUF_MAGIC:
            raise ValueError("GGUF magic invalid")
        self.version = cur.u32()
        if self.version not in (2, 3):
            raise ValueError(f"GGUF version {self.version} is not supported (2 or 3, little-endian)")
        n_tensors, n_kv = cur.u64(), cur.u64()
        if n_kv > cur.end or n_tensors > cur.end:
            raise ValueError(f"{n_kv} metadata items / {n_tensors} tensors exceed the file")
        self.fields: dict = {}
        for _ in range(n_kv):
            try:
                key = cur.raw_str().decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("a metadata key is not UTF-8") from None
            if key in self.fields:
                raise ValueError(f"duplicate metadata key {key!r}")
            self.fields[key] = cur.value(cur.u32())
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.u32()
            if n_dims > 8:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
            dims = [cur.u64() for _ in range(n_dims)]
            infos.append((name, dims, cur.u32(), cur.u64()))
        align = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
            raise ValueError(f"general.alignment must be a power of two, got {align!r}")
        self.data_offset = -(-cur.pos // align) * align
        self.tensors: list[GGUFTensor] = []
        seen = set()
        for name, dims, raw_type, offset in infos:
            if name in seen:
                raise ValueError(f"duplicate tensor {name!r}")
            seen.add(name)
            try:
                qtype = GGMLQuantizationType(raw_type)
                block, size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ValueError(f"tensor {name!r} has unknown GGML type {raw_type}") from None
            n = int(np.prod(dims, dtype=object)) if dims else 1
            if dims and dims[0] % block:
                raise ValueError(f"tensor {name!r}: {dims[0]} values per row is not a multiple of {qtype.name}'s block {block}")
            n_bytes = n // block * size
            start = self.data_offset + offset
            view = self.data[min(start, len(self.data)):min(start + n_bytes, len(self.data))]
            self.tensors.append(GGUFTensor(name, qtype, np.array(dims, np.uint64), n, n_bytes, view))
