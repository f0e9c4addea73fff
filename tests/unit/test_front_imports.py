"""The serving front's import closure: a router Pod runs kubeloop.front and
must start without the control plane's packages, so its image can be small
(requirements/front.txt) and an import added upstream cannot make it fail
there."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FRONT = REPO / "src" / "kubeloop" / "front"
CONTROL_PLANE = ("mlflow", "kfp", "kopf", "kubernetes", "torch", "kubeloop.components", "kubeloop.operator",
                 "kubeloop.serving", "kubeloop.pipelines", "kubeloop.registry", "kubeloop.dev", "kubeloop.story",
                 "kubeloop.cli")


def test_starting_the_router_imports_nothing_of_the_control_plane():
    # A fresh interpreter: this one has long since imported all of them.
    code = "import json, sys, kubeloop.front.router; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert "kubeloop.front.router" in loaded
    leaked = [name for name in loaded if any(name == bad or name.startswith(bad + ".") for bad in CONTROL_PLANE)]
    assert leaked == []


def _imported(path: Path) -> set[str]:
    """Every module a file imports, the lazy imports inside functions too:
    those run in a router Pod as surely as the ones at the top."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            # "from kubeloop.featurestore import definitions" names a module.
            names.update(f"{node.module}.{alias.name}" for alias in node.names if node.module.startswith("kubeloop"))
    return names


def _third_party_imports() -> set[str]:
    """The top-level third-party modules that kubeloop.front and every
    kubeloop module it reaches import."""
    seen: set[Path] = set()
    pending = sorted(FRONT.glob("*.py"))
    found: set[str] = set()
    while pending:
        path = pending.pop().resolve()  # an area's module is reached through its link
        if path in seen:
            continue
        seen.add(path)
        for name in _imported(path):
            top = name.split(".")[0]
            if top == "kubeloop":
                try:
                    spec = importlib.util.find_spec(name)
                except ModuleNotFoundError:  # a name imported from a module, not a module
                    continue
                if spec is not None and spec.origin and spec.origin.endswith(".py"):
                    pending.append(Path(spec.origin))
            elif top != "__future__" and top not in sys.stdlib_module_names:
                found.add(top)
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _listed() -> set[str]:
    lines = (REPO / "requirements" / "front.txt").read_text().splitlines()
    return {_normalized(re.split(r"[\[<>=!~;\s]", line.strip(), maxsplit=1)[0])
            for line in lines if line.strip() and not line.lstrip().startswith("#")}


def test_front_requirements_cover_what_the_front_imports():
    modules = _third_party_imports()
    assert {"orjson", "uvloop", "httptools", "prometheus_client", "tritonclient", "feast"} <= modules
    # Import names and distribution names differ (yaml is PyYAML): the
    # installed distributions say which provides which.
    providers = packages_distributions()
    listed = _listed()
    missing = {module: providers.get(module, [module]) for module in sorted(modules)
               if not listed & {_normalized(dist) for dist in providers.get(module, [module])}}
    assert missing == {}, "add to requirements/front.txt"
    assert not listed & {_normalized(name) for name in ("mlflow", "mlflow-skinny", "kfp", "kopf", "kubernetes",
                                                        "torch")}
