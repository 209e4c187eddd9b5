"""The lowbit model directory: what `lowbit convert` writes and `lowbit.load` mmaps.

    OUT/config.json              HF config keys + "lowbit": {"version", "format", "group_size",
                                 "lm_head_format", "embed_format", "source", "tensors": {name: meta}}
                                 meta = the PackedWeight's state()[0] (has "format"), or
                                 {"dtype": "float32", "shape": [...]} for dense tensors (norms)
    OUT/tokenizer.json, tokenizer_config.json
    OUT/model.safetensors        packed tensor X -> arrays "X.codes", "X.scale", ("X.offset" | "X.weight"...);
                                 dense tensor X -> float32 array "X"
         (or model-0000i-of-0000n.safetensors + model.safetensors.index.json when larger than one shard)

Writes are atomic: everything goes to a hidden temp folder next to OUT, renamed to OUT at the end;
a failure (or an interrupt) removes the temp folder, so nothing half-written ever loads.
Loading is zero-copy: arrays are views of a copy-on-write mmap of the safetensors files.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import uuid

import numpy as np

from lowbit.formats import FORMATS, PackedWeight, from_state
from lowbit.io.checkpoint import (
    Checkpoint, canonical_names, check_shape, expected_shape, normalize_config, read_json,
)
from lowbit.io.safetensors_file import SafetensorsFile, SafetensorsStreamWriter

VERSION = 1
SHARD_BYTES = 1 << 30
INDEX = "model.safetensors.index.json"
SHARD_METADATA = {"format": "lowbit"}


class OutputExistsError(FileExistsError, ValueError):
    """OUT exists and overwrite was not asked for."""


def is_lowbit_dir(path) -> bool:
    cfg = pathlib.Path(path) / "config.json"
    try:
        return cfg.is_file() and "lowbit" in json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def fsync_dir(d: pathlib.Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(d: pathlib.Path) -> None:
    """fsyncs every file in folder d, then d itself."""
    for f in d.iterdir():
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(d)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(out: pathlib.Path) -> None:
    """Removes .OUT.tmp-PID-* / .OUT.old-PID-* folders left next to OUT by writers that were killed
    (their process is gone); a live writer's folders are left alone."""
    for p in out.parent.glob(f".{out.name}.*-*-*"):
        kind, _, rest = p.name[len(out.name) + 2:].partition("-")
        pid = rest.split("-", 1)[0]
        if kind in ("tmp", "old") and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


class ModelDirWriter:
    """Streams tensors into a lowbit model directory.

        with ModelDirWriter(out, overwrite=False) as w:
            w.add(name, packed_or_float32)       # in model order
            w.finish(config, tokenizer, lowbit_meta)
    Leaving the block by an exception removes everything written.
    """

    def __init__(self, out, overwrite: bool = False, shard_bytes: int = SHARD_BYTES):
        self.out = pathlib.Path(out).expanduser().absolute()
        if self.out.exists() and not (self.out.is_dir() and not any(self.out.iterdir())):  # an empty dir is fine
            if not overwrite:
                raise OutputExistsError(f"{self.out} already exists; pass overwrite=True (lowbit convert --force) to replace it")
            if not is_lowbit_dir(self.out):
                raise OutputExistsError(f"{self.out} exists and is not a lowbit model directory; refusing to replace it")
        self.shard_bytes = int(shard_bytes)
        # the pid in the name lets a later writer remove what a killed one left behind (remove_stale_temps)
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.tensors: dict[str, dict] = {}
        self._shard: SafetensorsStreamWriter | None = None  # the shard being written (straight to disk)
        self._shards: list[tuple[str, list[str]]] = []  # (file name, array names)
        self._done = False

    def __enter__(self) -> "ModelDirWriter":
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.out)
        self.tmp.mkdir()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._shard is not None and not self._done:
            self._shard._f.close()
        if exc_type is not None or not self._done:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def add(self, name: str, value: PackedWeight | np.ndarray) -> None:
        """Writes one tensor to the current shard: a PackedWeight (its state arrays) or a dense array
        (stored float32). Nothing is kept in memory; a shard is closed once it holds shard_bytes."""
        if name in self.tensors:
            raise ValueError(f"tensor {name!r} added twice")
        if isinstance(value, PackedWeight):
            meta, arrays = value.state()
            arrays = {f"{name}.{k}": a for k, a in arrays.items()}
        else:
            value = np.asarray(value, dtype=np.float32)
            meta = {"dtype": "float32", "shape": list(value.shape)}
            arrays = {name: value}
        self.tensors[name] = meta
        for key, a in arrays.items():
            if self._shard is not None and not self._shard.fits(key, a, SHARD_METADATA):
                self._flush()  # the header room is full: next shard
            if self._shard is None:
                fname = f"part-{len(self._shards):05d}.safetensors"
                self._shard = SafetensorsStreamWriter(self.tmp / fname)
                self._shards.append((fname, []))
            self._shard.add(key, a)
            self._shards[-1][1].append(key)
        if self._shard is not None and self._shard.nbytes >= self.shard_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._shard is None:
            return
        self._shard.close(SHARD_METADATA)
        os.chmod(self._shard.path, 0o644)
        self._shard = None

    def finish(self, config: dict, tokenizer=None, lowbit: dict | None = None) -> pathlib.Path:
        """Writes the last shard, config.json and the tokenizer, then renames the temp folder to OUT."""
        self._flush()
        if not self._shards:
            raise ValueError("no tensors were written")
        if len(self._shards) == 1:
            os.rename(self.tmp / self._shards[0][0], self.tmp / "model.safetensors")
        else:
            n, weight_map, total = len(self._shards), {}, 0
            for i, (fname, keys) in enumerate(self._shards):
                final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
                os.rename(self.tmp / fname, self.tmp / final)
                weight_map.update({k: final for k in keys})
                total += (self.tmp / final).stat().st_size
            (self.tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
        cfg = {k: v for k, v in config.items() if k != "quantization_config"}
        cfg["lowbit"] = {"version": VERSION, **(lowbit or {}), "tensors": self.tensors}
        (self.tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        if tokenizer is not None:
            tokenizer.save(self.tmp)
        fsync_tree(self.tmp)  # every byte on disk before the rename makes the directory visible
        self._commit()
        self._done = True
        return self.out

    def _commit(self) -> None:
        old = None
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(self.out, old)
        try:
            os.rename(self.tmp, self.out)
        except OSError:
            if old is not None:
                os.rename(old, self.out)
            raise
        fsync_dir(self.out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


class LowbitCheckpoint(Checkpoint):
    """A lowbit model directory. load() returns PackedWeight over mmapped arrays, or float32 views of it."""

    kind = "lowbit"

    def __init__(self, path):
        super().__init__(path)
        raw = read_json(self.path / "config.json")
        self.lowbit: dict = raw.get("lowbit") or {}
        if not isinstance(self.lowbit, dict):
            raise ValueError(f"{self.path / 'config.json'}: the \"lowbit\" entry must be an object")
        if self.lowbit.get("version") != VERSION:
            raise ValueError(f"{self.path}: lowbit directory version {self.lowbit.get('version')!r} is not {VERSION}; "
                             "re-run lowbit convert")
        self.config = normalize_config({k: v for k, v in raw.items() if k != "lowbit"}, self.path / "config.json")
        self.metas: dict[str, dict] = self.lowbit.get("tensors") or {}
        self._check_metas()
        self.files = self._open_files()
        self.arrays: dict[str, dict[str, tuple[SafetensorsFile, str]]] = {n: {} for n in self.metas}
        for f in self.files:
            for key in f.keys():
                if key in self.metas and "format" not in self.metas[key]:
                    self.arrays[key][""] = (f, key)
                else:
                    base, _, part = key.rpartition(".")
                    if base in self.metas:
                        self.arrays[base][part] = (f, key)
        missing = [n for n in canonical_names(self.config, any(n.endswith("attn_sub_norm.weight") for n in self.metas))
                   if n not in self.metas]
        if missing:
            raise ValueError(f"{self.path / 'config.json'}: the lowbit tensor list lacks {len(missing)} tensors the config "
                             f"implies, e.g. {missing[:3]}")
        for name, meta in self.metas.items():
            if not self.arrays[name]:
                raise ValueError(f"{self.path}: tensor {name!r} is listed in config.json but has no arrays in the weights")
            try:
                want = expected_shape(self.config, name)
            except KeyError:
                continue
            got = (meta["M"], meta["K"]) if "format" in meta else tuple(meta["shape"])
            check_shape(self.path, name, got, want)

    def _check_metas(self) -> None:
        """The per-tensor metadata has the fields and types from_state relies on (a clear error, not a KeyError)."""
        where = self.path / "config.json"
        if not isinstance(self.metas, dict):
            raise ValueError(f"{where}: lowbit.tensors must be an object, got {type(self.metas).__name__}")
        for name, meta in self.metas.items():
            if not isinstance(meta, dict):
                raise ValueError(f"{where}: lowbit.tensors[{name!r}] must be an object, got {meta!r}")
            if "format" in meta:
                fmt = meta["format"]
                if not isinstance(fmt, str) or fmt not in FORMATS:
                    raise ValueError(f"{where}: tensor {name!r} has unknown format {fmt!r}")
                for key in ("M", "K", "group"):
                    v = meta.get(key)
                    if key == "group" and "group" not in meta:  # formats without groups (floats, rsr)
                        continue
                    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 31:
                        raise ValueError(f"{where}: tensor {name!r} needs a positive integer {key!r}, got {v!r}")
                bits = getattr(FORMATS[fmt], "bits", None)
                if bits is not None and "bits" in meta and meta["bits"] != bits:
                    raise ValueError(f"{where}: tensor {name!r} says bits={meta['bits']!r}; format {fmt} has {bits}")
            else:
                shape = meta.get("shape")
                if meta.get("dtype") != "float32" or not isinstance(shape, list) or not all(
                        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                    raise ValueError(f"{where}: dense tensor {name!r} needs dtype float32 and an integer shape, got {meta!r}")

    def _open_files(self) -> list[SafetensorsFile]:
        index = self.path / INDEX
        if index.is_file():
            try:
                names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{index}: malformed index ({e!r})") from None
        else:
            names = ["model.safetensors"]
        for n in names:
            if not (self.path / n).is_file():
                raise FileNotFoundError(f"{self.path / n}: weights file missing from the lowbit directory")
        return [SafetensorsFile(self.path / n) for n in names]

    def tensor_names(self) -> list[str]:
        return list(self.metas)

    def load(self, name: str):
        meta = self.metas.get(name)
        if meta is None:
            raise self._unknown(name)
        arrays = {part: f.raw(key) for part, (f, key) in self.arrays[name].items()}
        if "format" not in meta:
            if "" not in arrays or arrays[""].dtype != np.float32:
                raise ValueError(f"{self.path}: dense tensor {name!r} must be stored as one float32 array")
            if arrays[""].shape != tuple(meta["shape"]):
                raise ValueError(f"{self.path}: tensor {name!r} has shape {list(arrays[''].shape)}; "
                                 f"config.json says {meta['shape']}")
            return arrays[""]
        try:
            return from_state(meta, arrays)
        except (KeyError, ValueError, TypeError, ZeroDivisionError) as e:
            raise ValueError(f"{self.path}: cannot rebuild {name!r} as {meta.get('format')!r} ({e})") from None

    def prefault(self) -> None:
        """Faults every weight page in now (see SafetensorsFile.prefault)."""
        for f in self.files:
            f.prefault()

    def tokenizer(self):
        from lowbit.io.tokenizer import Tokenizer
        return Tokenizer.from_hf_dir(self.path, self.config)
