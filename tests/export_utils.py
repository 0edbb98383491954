"""What every SavedModel exporter keeps: it never writes where something already is."""

from __future__ import annotations

import os
import pathlib
import tempfile

import pytest


def check_never_writes_over_anything(export, tmp_path, name: str = "path") -> None:
    """`export(path)` refuses, naming its argument `name`, an empty path (the working
    directory), a directory with files in it (an earlier SavedModel) and an existing file,
    and leaves each as it was (in a new folder under `tmp_path`, the working directory during
    the calls)."""
    root = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    earlier = root / "earlier"
    earlier.mkdir()
    (earlier / "saved_model.pb").write_bytes(b"an earlier export")
    (earlier / "variables").mkdir()
    mine = root / "notes.txt"
    mine.write_text("the user's file")
    cwd = os.getcwd()
    os.chdir(root)  # where `path=""` wrote: the working directory
    try:
        for path in ("", str(earlier), str(mine)):
            with pytest.raises(ValueError, match=f"argument `{name}`"):
                export(path)
    finally:
        os.chdir(cwd)
    assert sorted(os.listdir(earlier)) == ["saved_model.pb", "variables"]
    assert (earlier / "saved_model.pb").read_bytes() == b"an earlier export"
    assert not os.listdir(earlier / "variables") and mine.read_text() == "the user's file"
    assert sorted(os.listdir(root)) == ["earlier", "notes.txt"]
