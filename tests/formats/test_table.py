"""The README's weight-format table is the one the registry generates (python -m lowbit.formats)."""
import pathlib

import pytest

from lowbit.formats import FORMATS, table

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_every_format_in_the_table():
    rows = table.format_rows()
    assert [r["format"] for r in rows] == list(FORMATS)
    bpw = {r["format"]: r["bits_per_weight"] for r in rows}
    assert bpw["f32"] == 32 and bpw["bf16"] == 16 and bpw["int8"] == pytest.approx(8.5)  # 8 + 16/32


@pytest.mark.skipif(not README.is_file(), reason="README.md is not beside the tests (installed package)")
def test_readme_table_is_generated():
    block = table.readme_block(README.read_text())
    assert block is not None, "README.md lost its format-table markers"
    assert block == table.markdown(), "README's format table drifted: run python -m lowbit.formats --update-readme README.md"


def test_update_readme(tmp_path):
    p = tmp_path / "README.md"
    p.write_text(f"intro\n{table.BEGIN}\n| stale |\n{table.END}\nrest\n")
    assert table.update_readme(p) and table.readme_block(p.read_text()) == table.markdown()
    assert not table.update_readme(p)  # already up to date
    p.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        table.update_readme(p)


def test_update_readme_failing_midway_leaves_it_intact(tmp_path, monkeypatch):
    # the README was truncated first (path.write_text): a failure while writing left it cut short
    p = tmp_path / "README.md"
    old = f"intro\n{table.BEGIN}\n| stale |\n{table.END}\nrest\n"
    p.write_text(old)
    p.chmod(0o640)
    monkeypatch.setattr(table, "markdown", lambda: "| ok |\n| \udc80 |")  # a lone surrogate: utf-8 fails mid-write
    with pytest.raises(UnicodeEncodeError):
        table.update_readme(p)
    assert p.read_text() == old and sorted(f.name for f in tmp_path.iterdir()) == ["README.md"]  # no temp file left
    monkeypatch.setattr(table, "markdown", lambda: "| fresh — table |")
    assert table.update_readme(p)
    assert table.readme_block(p.read_text(encoding="utf-8")) == "| fresh — table |"
    assert (p.stat().st_mode & 0o777) == 0o640 and sorted(f.name for f in tmp_path.iterdir()) == ["README.md"]
