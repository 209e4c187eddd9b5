"""A zero-copy safetensors reader: parse the header ourselves, mmap the file, slice arrays at offsets.

File layout (https://github.com/huggingface/safetensors):
    [8 bytes: little-endian u64 N] [N bytes: JSON header] [data]
    header = {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}}
    offsets are relative to the start of the data section.

bf16 has no numpy dtype: ``raw`` returns its bits as uint16 and ``float32`` widens them.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import pathlib

import numpy as np

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
MAX_HEADER = 100 * 1024 * 1024
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14: fault every page in, one call
PAGE = 4096


def release_pages(mm) -> None:
    """MADV_DONTNEED on an np.memmap's mapping (no-op where unsupported); only for read-only use."""
    m = getattr(mm, "_mmap", None)
    if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            m.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits [...] -> float32 [...] (exact)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


class SafetensorsFile:
    """One .safetensors file, read lazily through a copy-on-write mmap.

    Attributes: path, header (name -> {dtype, shape, data_offsets}), metadata (the __metadata__ dict).
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such safetensors file")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{self.path}: not a safetensors file (only {size} bytes; truncated?)")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER or 8 + n > size:
                raise ValueError(f"{self.path}: safetensors header claims {n} bytes but the file has {size} (truncated or not safetensors)")
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"{self.path}: malformed safetensors header ({e})") from None
        if not isinstance(header, dict):
            raise ValueError(f"{self.path}: malformed safetensors header (not a JSON object)")
        self.metadata: dict = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        data_size = size - self._data_start
        for name, info in header.items():
            self._check_entry(name, info, data_size)
        self.header: dict[str, dict] = header
        self._mm: np.memmap | None = None

    def _check_entry(self, name: str, info, data_size: int) -> None:
        try:
            dtype = DTYPES[info["dtype"]]
            begin, end = info["data_offsets"]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (begin, end)):
                raise ValueError("bad offsets")
            shape = info["shape"]
            if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40
                                                      for d in shape):
                raise ValueError("bad shape")
            count = math.prod(shape)
        except (KeyError, TypeError, ValueError, OverflowError):
            raise ValueError(f"{self.path}: malformed header entry for tensor {name!r}: {info!r}") from None
        if end > data_size:
            raise ValueError(f"{self.path}: tensor {name!r} ends at byte {end} of a {data_size}-byte data section (file truncated)")
        if not 0 <= begin <= end or (end - begin) != count * dtype.itemsize:
            raise ValueError(f"{self.path}: tensor {name!r} has offsets {begin}..{end} that do not fit "
                             f"shape {info['shape']} of {info['dtype']}")

    def keys(self) -> list[str]:
        return list(self.header)

    def __contains__(self, name: str) -> bool:
        return name in self.header

    def dtype(self, name: str) -> str:
        return self.header[name]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(s) for s in self.header[name]["shape"])

    def raw(self, name: str) -> np.ndarray:
        """The stored array as a view of the (copy-on-write) mmap, no copy; bf16 comes back as uint16 bits."""
        try:
            info = self.header[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r}") from None
        dtype = DTYPES[info["dtype"]]
        shape = tuple(int(s) for s in info["shape"])
        begin = info["data_offsets"][0]
        if self._mm is None:
            if os.path.getsize(self.path) == self._data_start:  # no data at all: every tensor is empty
                return np.zeros(shape, dtype)
            # copy-on-write (MAP_PRIVATE): reads share the page cache, nothing is copied unless written,
            # writes never reach the file; and kernels that take non-const arrays accept the views
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="c")
        return np.ndarray(shape, dtype, buffer=self._mm, offset=self._data_start + begin)

    def release(self) -> None:
        """Drops this file's pages from the process (MADV_DONTNEED; they stay in the page cache and fault
        back in if read again): a conversion reads each tensor once, so its RSS need not grow with the file."""
        release_pages(self._mm)

    def prefault(self) -> None:
        """Maps every page of the file now (read from disk if needed), so the first kernel call that
        reads the weights does not pay the page faults: MADV_POPULATE_READ where the kernel has it,
        else MADV_WILLNEED and a read of one byte per page."""
        if self._mm is None:
            if os.path.getsize(self.path) == self._data_start:
                return
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="c")
        m = getattr(self._mm, "_mmap", None)
        if m is not None and hasattr(m, "madvise"):
            try:
                m.madvise(MADV_POPULATE_READ)
                return
            except (OSError, ValueError):
                try:
                    m.madvise(mmap.MADV_WILLNEED)
                except (OSError, ValueError, AttributeError):
                    pass
        int(self._mm[::PAGE].max())  # touch one byte per page

    def float32(self, name: str) -> np.ndarray:
        """The tensor as float32 (bf16/f16/f64/ints are converted; f32 is returned as a view)."""
        a = self.raw(name)
        if self.dtype(name) == "BF16":
            return bf16_to_f32(a)
        return a if a.dtype == np.float32 else a.astype(np.float32)


NUMPY_TO_ST = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64",
               np.dtype("<i4"): "I32", np.dtype("<i2"): "I16", np.dtype("i1"): "I8", np.dtype("<u8"): "U64",
               np.dtype("<u4"): "U32", np.dtype("<u2"): "U16", np.dtype("u1"): "U8", np.dtype("?"): "BOOL"}


class SafetensorsStreamWriter:
    """Writes a .safetensors file one array at a time, straight to disk (nothing is held in memory).

    The header goes first in the format, so room for it is reserved up front and filled at close(),
    padded with spaces (the format allows trailing whitespace in the header). fits(key, shape) says
    whether one more entry still fits in that room.

        w = SafetensorsStreamWriter(path); w.add("x", arr); ...; w.close({"format": "lowbit"})
    """

    def __init__(self, path, header_room: int = 1 << 18, dtypes: dict[str, str] | None = None):
        self.path = pathlib.Path(path)
        self.room = int(header_room) // 8 * 8  # data starts 8-byte aligned
        self.entries: dict[str, dict] = {}
        self.offset = 0
        self._header_len = self._header_meta = None  # fits()' cache
        self._f = open(self.path, "wb")
        self._f.write(b"\0" * (8 + self.room))

    def _entry(self, arr: np.ndarray, dtype: str | None = None) -> dict:
        st = dtype or NUMPY_TO_ST.get(arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype)
        if st is None:
            raise ValueError(f"{self.path}: dtype {arr.dtype} cannot be stored in safetensors")
        return {"dtype": st, "shape": [int(s) for s in arr.shape], "data_offsets": [self.offset, self.offset + arr.nbytes]}

    def _header(self, metadata=None, extra: dict | None = None) -> bytes:
        h = {"__metadata__": metadata or {}, **self.entries, **(extra or {})}
        return json.dumps(h, separators=(",", ":")).encode()

    def fits(self, key: str, arr: np.ndarray, metadata=None) -> bool:
        # the header so far (cached until the next add) + "," + '"key":{entry}': linear, not quadratic, in entries
        if self._header_len is None or self._header_meta is not metadata:
            self._header_len, self._header_meta = len(self._header(metadata)), metadata
        entry = json.dumps({key: self._entry(arr)}, separators=(",", ":"))[1:-1].encode()
        return self._header_len + 1 + len(entry) <= self.room

    def add(self, key: str, arr: np.ndarray, dtype: str | None = None) -> None:
        if key in self.entries:
            raise ValueError(f"{self.path}: array {key!r} written twice")
        arr = np.ascontiguousarray(arr)
        self.entries[key] = self._entry(arr, dtype)
        self._header_len = None
        self._f.write(memoryview(arr.reshape(-1).view(np.uint8)))
        self.offset += arr.nbytes

    @property
    def nbytes(self) -> int:
        return self.offset

    def close(self, metadata: dict | None = None) -> None:
        header = self._header(metadata)
        if len(header) > self.room:
            self._f.close()
            raise ValueError(f"{self.path}: header of {len(header)} bytes exceeds the {self.room} reserved")
        self._f.seek(0)
        self._f.write(self.room.to_bytes(8, "little"))
        self._f.write(header + b" " * (self.room - len(header)))
        self._f.close()
