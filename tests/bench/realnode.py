"""Suites that need the real node start a platform of their own with it
(the shared bench platform is fake-only) and take it down afterwards."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from rich.console import Console

from kubeloop.dev.platform import Platform


def on_a_real_node(suite: str, console: Console, measure: Callable[[Platform, Path], dict]) -> dict:
    """measure(platform, a scratch folder) on a platform with the real node."""
    with tempfile.TemporaryDirectory(prefix=f"kubeloop-bench-{suite}-") as tmp:
        platform = Platform(Path(tmp) / "platform", real_node=True)
        with console.status(f"{suite}: the platform with its real node"):
            platform.up()
        try:
            return measure(platform, Path(tmp))
        finally:
            platform.down()
