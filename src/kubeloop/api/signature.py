"""A registered model's signature: what it takes and what it answers.

Recorded at registration (the version tag `kubeloop.signature`) and followed
by everything downstream: the ONNX export, Triton's config.pbtxt, the serving
router, the request log and the drift job. One input tensor, `features`
(FP32, [batch, n]) in the order of `feature_columns`; one output whose name
and width follow the task:

| task       | output          | dims | meaning                                 |
|------------|-----------------|------|-----------------------------------------|
| binary     | `probability`   | [1]  | P(label == 1)                           |
| multiclass | `probabilities` | [C]  | P(class) in the order of `classes`      |
| regression | `value`         | [1]  | the predicted label value               |
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from kubeloop.api.tasks import INPUT, OUTPUTS, Task
TAG = "kubeloop.signature"
MISSING_VALUE = 0.0
"""What a feature with no value becomes, in the training data (the offline
store's gaps) and at serving (a missing or stale online value, by default)."""


class ModelSignature(BaseModel):
    model_config = ConfigDict(frozen=True)

    task: Task = "binary"
    feature_columns: list[str]
    """Input columns, in the order the model was trained on."""
    classes: list[str] = Field(default_factory=list)
    """Multiclass: the label values, in output order; empty otherwise."""
    threshold: float | None = None
    """Binary: the score above which a row is predicted positive."""
    feature_views: list[str] = Field(default_factory=list)
    """The Feast feature views the features come from."""
    entities: list[str] = Field(default_factory=list)
    """The entity join keys a caller sends to look the features up."""
    request_columns: list[str] = Field(default_factory=list)
    """Request-time columns of on-demand feature views a caller sends."""
    label: str = ""
    """The label column the model learned."""

    @property
    def input_name(self) -> str:
        return INPUT

    @property
    def n_inputs(self) -> int:
        return len(self.feature_columns)

    @property
    def output_name(self) -> str:
        return OUTPUTS[self.task]

    @property
    def n_outputs(self) -> int:
        """Width of the output per row (and of the network's last layer)."""
        return len(self.classes) if self.task == "multiclass" else 1

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ModelSignature":
        return cls.model_validate_json(text)

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> "ModelSignature":
        """The signature of a registered version; versions registered before
        signatures existed are binary models over their feature_columns tag."""
        if TAG in tags:
            return cls.from_json(tags[TAG])
        threshold = float(tags["threshold"]) if "threshold" in tags else 0.5
        return cls(feature_columns=json.loads(tags.get("feature_columns", "[]")), threshold=threshold,
                   label=tags.get("label", ""))
