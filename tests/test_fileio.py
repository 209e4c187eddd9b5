"""lowbit._fileio.atomic_write_text: the old file or the new one, never a mix, whatever fails."""
import os

import pytest

from lowbit import _fileio
from lowbit._fileio import atomic_write_text


def names(d):
    return sorted(f.name for f in d.iterdir())


def test_writes_new_and_existing_files(tmp_path):
    p = tmp_path / "a.txt"
    atomic_write_text(p, "one — 1\n")
    assert p.read_text(encoding="utf-8") == "one — 1\n" and names(tmp_path) == ["a.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert (p.stat().st_mode & 0o777) == 0o666 & ~umask  # as open(p, "w") would make it
    p.chmod(0o600)
    atomic_write_text(str(p), "two")
    assert p.read_text() == "two" and (p.stat().st_mode & 0o777) == 0o600  # an existing file keeps its mode


def test_a_symlink_keeps_pointing_at_the_rewritten_target(tmp_path):
    target, link = tmp_path / "target.md", tmp_path / "link.md"
    target.write_text("old")
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new" and names(tmp_path) == ["link.md", "target.md"]


@pytest.mark.parametrize("fail", ["encode", "fsync", "replace"])
def test_a_failure_leaves_the_old_file(tmp_path, monkeypatch, fail):
    p = tmp_path / "a.txt"
    p.write_text("old")
    text = "new"
    if fail == "encode":
        text = "new \udc80"  # a lone surrogate: utf-8 fails after the file was opened
    else:
        def boom(*a, **k):
            raise OSError(f"{fail} failed")

        monkeypatch.setattr(_fileio.os, fail, boom)
    with pytest.raises((OSError, UnicodeEncodeError)):
        atomic_write_text(p, text)
    assert p.read_text() == "old" and names(tmp_path) == ["a.txt"]  # the temp file is gone too
