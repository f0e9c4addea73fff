"""The repository layout: the area folders are kubeloop.<area> through one
declaration (a symlink src/kubeloop/<area> -> ../../<area> each), which the
wheel, the import-linter's roots and these tests follow; and the top-level
operator/ folder never shadows the standard library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "kubeloop"
AREAS = tuple(sorted(p.name for p in PACKAGE.iterdir() if p.is_symlink()))


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


def test_each_area_is_declared_once_as_a_relative_link_into_the_package():
    assert set(AREAS) >= {"operator", "pipelines", "components", "featurestore", "monitoring"}
    for area in AREAS:
        link = PACKAGE / area
        # Relative, so a clone or an image build context anywhere resolves it.
        assert str(link.readlink()) == f"../../{area}" and link.resolve() == REPO / area, area


def test_the_import_linter_roots_are_the_package_and_its_areas():
    """grimp does not follow the links, so each area is a root of its own;
    an area added without one would escape every contract."""
    import tomllib

    roots = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
    assert sorted(roots) == sorted(["kubeloop", *(f"kubeloop.{area}" for area in AREAS)])


def test_a_plain_wheel_holds_every_area_and_the_front(tmp_path):
    """`pip install .` (no editable mode) installs what the links declare."""
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("kubeloop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("operator/handlers.py", "monitoring/outcomes/job.py", "pipelines/compiled/training.yaml",
                   "front/router.py", "api/conditions.py"):
        assert f"kubeloop/{module}" in names, module
    for area in AREAS:
        expected = {f"kubeloop/{p.relative_to(REPO).as_posix()}" for p in (REPO / area).rglob("*.py")
                    if "__pycache__" not in p.parts}
        assert expected <= names, sorted(expected - names)[:5]


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
    """Below an area's root, a folder of modules is a regular package: a
    namespace one would shadow, or be shadowed by, any other portion."""
    for area in ("src/kubeloop", *AREAS):
        for py in (REPO / area).rglob("*.py"):
            folder = py.parent
            if folder == REPO / area or "__pycache__" in folder.parts:
                continue
            assert (folder / "__init__.py").exists(), f"{folder} has modules but no __init__.py"


def _area_layers() -> list[str]:
    """The layers of the one-way area contract, short names ("serving | pipelines")."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["name"].startswith("Areas depend one way")]
    return [layer.replace("kubeloop.", "") for layer in contract["layers"]]


def _readme_picture() -> list[str]:
    """The rows of README's area picture: the code block after "depend one way"."""
    text = (REPO / "README.md").read_text()
    block = text.split("depend one way", 1)[1].split("```\n", 2)[1]
    return [line.split("  ")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_architecture_picture_is_the_area_contract():
    assert _readme_picture() == _area_layers()


def test_every_area_and_top_level_module_is_in_one_layer():
    """A new area or module outside the contract could import anything; the
    contract must name each one exactly once."""
    named = [name.strip() for layer in _area_layers() for name in layer.replace(":", "|").split("|")]
    present = {p.stem for p in (REPO / "src" / "kubeloop").iterdir()
               if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
    present |= {area for area in AREAS if (REPO / area).is_dir()}
    assert sorted(named) == sorted(present)
