"""Writing a file atomically: readers, and a crash at any point, see the old file or the new one, never a mix."""
from __future__ import annotations

import os
import pathlib
import stat
import uuid


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> None:
    """Writes `text` to `path` through a temp file beside it (the same filesystem), flushed to disk, then
    os.replace. An existing file keeps its permission bits (a new one gets open()'s, under the umask); a
    symlink's target is rewritten, not the link. On any failure the temp file is removed and `path` is as
    it was."""
    path = pathlib.Path(os.path.realpath(path))
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
