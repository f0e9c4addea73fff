"""Where a checkout and its machine-wide caches live: the local platform, the
local Triton runtime and the tests all resolve these the same way."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The checkout this package was installed from (editable installs link
    back to it), or $KUBELOOP_REPO."""
    if "KUBELOOP_REPO" in os.environ:
        return Path(os.environ["KUBELOOP_REPO"])
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "tools" / "versions.env").exists():
            return parent
    raise FileNotFoundError(f"no kubeloop checkout above {here}; set KUBELOOP_REPO")


def cache_dir() -> Path:
    """Big downloads and builds, kept outside the checkout and keyed by version."""
    return Path(os.environ.get("KUBELOOP_CACHE", Path.home() / ".cache" / "kubeloop"))
