"""Prometheus' own checker (Debian's prometheus package) on rule groups."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml


def check_rules(groups: list[dict], folder: Path) -> subprocess.CompletedProcess:
    """`promtool check rules` on a rules file holding these groups."""
    promtool = shutil.which("promtool")
    if not promtool:  # `make debs` installs it; a bare checkout may lack it
        pytest.skip("promtool is not installed (Debian package prometheus)")
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
