"""Maps the top-level area folders onto the kubeloop package.

pyproject.toml holds the project's metadata; this file only discovers the
packages, so a new subpackage needs no list to be edited. The core lives in
src/kubeloop; the areas (operator/, pipelines/, ...) become kubeloop.<area>.
Their root folders have no __init__.py, so running Python from the repository
root can never shadow the standard library's `operator` with ours.
"""

from pathlib import Path

from setuptools import setup

AREAS = ("operator", "pipelines", "components", "featurestore", "monitoring")


def _subpackages(root: Path, prefix: str) -> list[str]:
    found = [prefix]
    for init in sorted(root.rglob("__init__.py")):
        relative = init.parent.relative_to(root)
        if relative.parts:
            found.append(".".join((prefix, *relative.parts)))
    return found


present = [area for area in AREAS if Path(area).is_dir()]
package_dir = {"kubeloop": "src/kubeloop", **{f"kubeloop.{area}": area for area in present}}
packages = _subpackages(Path("src/kubeloop"), "kubeloop")
for area in present:
    packages += _subpackages(Path(area), f"kubeloop.{area}")

setup(package_dir=package_dir, packages=packages)
