"""The operator's image is lean (images/operator.txt: no boto3, pandas,
numpy, Feast, torch). Cluster path, in miniature: the CLI and the operator's
wiring, as the chart configures it, must start without them. A module-level
boto3 import in the local platform's code (which the CLI loads) once made
the chart's operator Pod crash at start; the real node's chart test found it
after minutes, this finds it in a second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ABSENT = ("boto3", "botocore", "pandas", "numpy", "feast", "torch", "evidently", "onnxruntime", "pyarrow")
OPERATOR_PACKAGES = Path(__file__).resolve().parents[2] / "images" / "operator.txt"

START = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {absent}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the operator image)")
sys.meta_path.insert(0, Absent())
import kubeloop.cli.main
from kubeloop.operator import handlers, wiring
from kubeloop.operator.settings import OperatorConfig
config = OperatorConfig.from_env({{
    "MLFLOW_TRACKING_URI": "http://mlflow:5000", "KUBELOOP_DRIFT_MONITOR": "kubernetes",
    "KUBELOOP_PIPELINE_BACKENDS": "noop", "KUBELOOP_PIPELINE_BACKEND": "noop",
    "KUBELOOP_ROUTER_IMAGE": "runtime:1", "KUBELOOP_REQUEST_LOG": "s3://requests"}})
wiring.build_monitor(config, None)
wiring.build_serving_backends(config, None)
print("started")
"""


def test_the_operator_starts_without_the_packages_its_image_does_not_have():
    listed = {line.split("[")[0].strip() for line in OPERATOR_PACKAGES.read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert not listed & set(ABSENT), "the operator image installs these after all"
    run = subprocess.run([sys.executable, "-c", START.format(absent=set(ABSENT))], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "started" in run.stdout, run.stderr[-2000:]
