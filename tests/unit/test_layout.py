"""The repository layout: the area folders are kubeloop.<area>, and the
top-level operator/ folder never shadows the standard library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AREAS = ("operator", "pipelines", "components", "featurestore", "monitoring")


@pytest.mark.parametrize("flags", [[], ["-S"], ["-I"]], ids=["plain", "no-site", "isolated"])
def test_import_operator_from_the_repository_root_is_the_stdlib(flags):
    # -S skips site, so nothing imports the stdlib operator before our code
    # runs: the case in which a regular package named operator would win.
    code = "import operator, sys; print(operator.__file__); print(operator.itemgetter(1)([0, 7]))"
    result = subprocess.run([sys.executable, *flags, "-c", code], cwd=REPO, capture_output=True,
                            text=True, check=True)
    path, value = result.stdout.split()
    assert Path(path).parent == Path(subprocess.__file__).parent
    assert value == "7"


def test_area_roots_are_not_regular_packages():
    for area in AREAS:
        folder = REPO / area
        if folder.exists():
            assert not (folder / "__init__.py").exists(), f"{area}/__init__.py would make it shadowable"


def test_areas_import_as_kubeloop_subpackages():
    import kubeloop.operator.handlers as handlers
    import kubeloop.pipelines.backends.base as backends

    assert Path(handlers.__file__).resolve() == REPO / "operator" / "handlers.py"
    assert Path(backends.__file__).resolve() == REPO / "pipelines" / "backends" / "base.py"


def test_every_python_folder_is_packaged():
    """setup.py discovers packages through __init__.py files: a folder of
    Python modules without one would silently be left out of the wheel."""
    for area in ("src/kubeloop", *AREAS):
        for py in (REPO / area).rglob("*.py"):
            folder = py.parent
            if folder == REPO / area or "__pycache__" in folder.parts:
                continue
            assert (folder / "__init__.py").exists(), f"{folder} has modules but no __init__.py"
