"""The three kinds, and the CustomResourceDefinitions generated from them."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from kubeloop.api.conditions import (
    INFERENCE_SERVICE_CONDITIONS, OPTIMIZED_MODEL_CONDITIONS, TRAINING_JOB_CONDITIONS, KindConditions,
)
from kubeloop.api.constants import API_VERSION, CATEGORY, GROUP, VERSION
from kubeloop.api.optimization import OptimizedModelSpec, OptimizedModelStatus
from kubeloop.api.schema import model_schema
from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus
from kubeloop.api.training import TrainingJobSpec, TrainingJobStatus


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    description: str
    type: str = "string"
    priority: int = 0


@dataclass(frozen=True)
class Kind:
    """One custom resource kind: its names, models, conditions and printer columns."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    description: str
    spec: type[BaseModel]
    status: type[BaseModel]
    conditions: KindConditions
    columns: tuple[PrinterColumn, ...]

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def api_version(self) -> str:
        return API_VERSION


_AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "Time since creation", "date")

TRAINING_JOB = Kind(
    kind="TrainingJob",
    plural="trainingjobs",
    short_names=("kltj",),
    description=(
        "TrainingJob trains a model on Feast features through a Kubeflow pipeline, "
        "tracks the run in MLflow and registers the result as a new model version."
    ),
    spec=TrainingJobSpec,
    status=TrainingJobStatus,
    conditions=TRAINING_JOB_CONDITIONS,
    columns=(
        PrinterColumn("Phase", ".status.phase", "Pending, Running, Succeeded or Failed"),
        PrinterColumn("Model", ".spec.modelName", "Registered model name"),
        PrinterColumn("Version", ".status.model.version", "Registered version"),
        PrinterColumn("AUC", ".status.metrics.auc", "Held-out AUC", "number"),
        PrinterColumn("Backend", ".status.backend", "Pipeline backend", priority=1),
        PrinterColumn("Run", ".status.runId", "Pipeline run id", priority=1),
        _AGE,
    ),
)

OPTIMIZED_MODEL = Kind(
    kind="OptimizedModel",
    plural="optimizedmodels",
    short_names=("klom",),
    description=(
        "OptimizedModel builds faster variants of a registered model (quantisation, "
        "pruning, distillation, compilation), measures each on the target hardware and "
        "registers the fastest one within the accuracy budget."
    ),
    spec=OptimizedModelSpec,
    status=OptimizedModelStatus,
    conditions=OPTIMIZED_MODEL_CONDITIONS,
    columns=(
        PrinterColumn("Phase", ".status.phase", "Pending, Running, Succeeded or Failed"),
        PrinterColumn("Source", ".spec.source.name", "Source model"),
        PrinterColumn("Winner", ".status.chosen.technique", "Chosen variant"),
        PrinterColumn("Speedup", ".status.chosen.speedup", "Speedup against the source", "number"),
        PrinterColumn("Version", ".status.model.version", "Registered version of the winner"),
        _AGE,
    ),
)

INFERENCE_SERVICE = Kind(
    kind="InferenceService",
    plural="inferenceservices",
    short_names=("klis",),
    description=(
        "InferenceService serves a registered model on Triton with the right share of a "
        "GPU (MIG, MPS or whole), with canary and shadow traffic, drift monitoring and "
        "retraining."
    ),
    spec=InferenceServiceSpec,
    status=InferenceServiceStatus,
    conditions=INFERENCE_SERVICE_CONDITIONS,
    columns=(
        PrinterColumn("Phase", ".status.phase", "Pending, Ready, Degraded or Failed"),
        PrinterColumn("Model", ".spec.model.name", "Registered model"),
        PrinterColumn("Version", ".status.modelVersion", "Version serving the main traffic"),
        PrinterColumn("Placement", ".status.placement.resource", "GPU resource chosen"),
        PrinterColumn("URL", ".status.url", "Inference endpoint"),
        PrinterColumn("Canary", ".status.canaryVersion", "Canary version", priority=1),
        _AGE,
    ),
)

KINDS: tuple[Kind, ...] = (TRAINING_JOB, OPTIMIZED_MODEL, INFERENCE_SERVICE)


def build_crd(kind: Kind) -> dict:
    """The CustomResourceDefinition of a kind (pure)."""
    spec_schema = model_schema(kind.spec)
    status_schema = model_schema(kind.status)
    spec_schema["description"] = kind.spec.__doc__.strip()
    status_schema["description"] = kind.status.__doc__.strip()
    status_schema["properties"]["conditions"]["description"] = kind.conditions.description()
    schema = {
        "type": "object",
        "description": kind.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "The API version, kubeloop.dev/v1alpha1."},
            "kind": {"type": "string", "description": f"The kind, {kind.kind}."},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": [CATEGORY],
            },
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [_column(c) for c in kind.columns],
                "schema": {"openAPIV3Schema": schema},
            }],
        },
    }


def _column(column: PrinterColumn) -> dict:
    out = {"name": column.name, "type": column.type, "jsonPath": column.json_path,
           "description": column.description}
    if column.priority:
        out["priority"] = column.priority
    return out

