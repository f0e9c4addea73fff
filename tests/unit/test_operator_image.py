"""The operator's image is lean (images/operator.txt: no boto3, pandas,
numpy, Feast, torch). Cluster path, in miniature: the CLI and the operator's
wiring, as the chart configures it, must start with nothing but what the
image installs (the packages operator.txt names and what they require). A
module-level boto3 import in the local platform's code (which the CLI loads)
once made the chart's operator Pod crash at start, and so did tenacity,
missing from the list; the real node's chart test found each after minutes,
this finds it in a second."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ABSENT = ("boto3", "botocore", "pandas", "numpy", "feast", "torch", "evidently", "onnxruntime", "pyarrow")
OPERATOR_PACKAGES = Path(__file__).resolve().parents[2] / "images" / "operator.txt"


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def installed_with(requirements: list[str]) -> set[str]:
    """The distributions pip installs for these requirements (the image's
    venv), as this venv's metadata says, markers evaluated here."""
    wanted, seen = [Requirement(r) for r in requirements], set()
    while wanted:
        requirement = wanted.pop()
        name = _name(requirement.name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        if name in seen and not requirement.extras:
            continue
        seen.add(name)
        for text in requires:
            sub = Requirement(text)
            extras = requirement.extras or {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                wanted.append(sub)
    return seen


def not_in_the_image(requirements: list[str]) -> set[str]:
    """Top-level modules of this venv that no distribution of the image provides."""
    image = installed_with(requirements) | {"kubeloop"}
    return {module for module, dists in metadata.packages_distributions().items()
            if not {_name(d) for d in dists} & image and module.isidentifier()}


START = """
import sys
# None in sys.modules is how Python spells "not installed": an import fails,
# importlib.util.find_spec answers None (libraries probe optional packages so).
for name in {absent}:
    sys.modules[name] = None
import kubeloop.cli.main
from kubeloop.operator import handlers, wiring
from kubeloop.operator.settings import OperatorConfig
config = OperatorConfig.from_env({{
    "MLFLOW_TRACKING_URI": "http://mlflow:5000", "KUBELOOP_DRIFT_MONITOR": "kubernetes",
    "KUBELOOP_PIPELINE_BACKENDS": "{pipelines}", "KUBELOOP_PIPELINE_BACKEND": "{pipelines}",
    "KUBELOOP_TRAINING_IMAGE": "training:1", "KUBELOOP_KFP_ENDPOINT": "http://ml-pipeline:8888",
    "KUBELOOP_SERVING_BACKENDS": "kserve,kubernetes", "KUBELOOP_SERVING_BACKEND": "kserve",
    "KUBELOOP_MATERIALIZER": "kubernetes", "KUBELOOP_OPERATOR_NAMESPACE": "kubeloop-system",
    "KUBELOOP_ROUTER_IMAGE": "runtime:1", "KUBELOOP_REQUEST_LOG": "s3://requests"}})
wiring.build_monitor(config, None)
wiring.build_serving_backends(config, None)
wiring.build_pipeline_backends(config, object())  # a cluster the backends keep, never called here
print("started")
"""


# Each pipeline backend the chart's pipelines.backend may name: the trainer
# backend's wiring once imported numpy (through the registration step's
# module), which only the cluster loop's chart Pod found.
@pytest.mark.parametrize("pipelines", ["noop", "trainer", "kfp"])
def test_the_operator_starts_without_the_packages_its_image_does_not_have(pipelines):
    listed = [line.strip() for line in OPERATOR_PACKAGES.read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    absent = not_in_the_image(listed)
    assert set(ABSENT) <= absent, "the operator image installs these after all"
    run = subprocess.run([sys.executable, "-c", START.format(absent=absent, pipelines=pipelines)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "started" in run.stdout, run.stderr[-2000:]


def test_what_the_image_lacks_is_what_its_list_leaves_out():
    assert "tenacity" in not_in_the_image(["kopf"])
    assert "tenacity" not in not_in_the_image(["kopf", "tenacity"])
    assert "yaml" not in not_in_the_image(["kubernetes"])  # required by the kubernetes client
