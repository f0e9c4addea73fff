"""State files that other processes read while they are rewritten."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_if_changed(path: Path, text: str) -> bool:
    """Write atomically unless the file already holds the text (its watchers
    reload on every change); True when it wrote."""
    if path.exists() and path.read_text() == text:
        return False
    write_atomic(path, text)
    return True
