"""What the Makefile says, for tests that pin a build to it."""

from __future__ import annotations

import re

from kubeloop.paths import repo_root


def prebuild() -> str:
    """The commands make test runs beside the unit tests for the real node's
    builds (PREBUILD), joined on one line; empty if the Makefile has none."""
    found = re.search(r"^PREBUILD :=(.*?)\n\S", (repo_root() / "Makefile").read_text(), re.M | re.S)
    return " ".join(found.group(1).replace("\\\n", " ").split()) if found else ""


def prebuild_is_niced() -> bool:
    """Whether make test runs PREBUILD at low priority."""
    return "nice -n 10 sh -c '$(PREBUILD)'" in (repo_root() / "Makefile").read_text()
