"""kubeloop: a Kubernetes-native MLOps operator.

The core lives here (the typed API, the GPU catalogue, the local platform and
the CLI); the areas live in top-level folders mapped onto this package by
pyproject.toml: kubeloop.operator (operator/), kubeloop.pipelines
(pipelines/), kubeloop.components (components/), kubeloop.featurestore
(featurestore/) and kubeloop.monitoring (monitoring/). Those folders carry no
__init__.py of their own, so that running Python from the repository root can
never shadow the standard library's `operator` module with ours.
"""

__version__ = "0.1.0"
