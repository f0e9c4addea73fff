"""Training data: labelled entity rows joined point-in-time with Feast
features, split by time into train and hold-out, written as parquet."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from kubeloop.api.signature import MISSING_VALUE
from kubeloop.api.training import TrainingJobSpec

SPLIT = "split"


@dataclass(frozen=True)
class DatasetInfo:
    """What the training data is, recorded with the model for lineage."""

    entity_rows: int
    dropped_by_ttl: int
    rows: int
    train_rows: int
    holdout_rows: int
    positives: int
    """Binary: rows labelled 1 (0 for other tasks)."""
    dataset_hash: str
    feature_columns: list[str]
    label: str
    feature_views: dict[str, str]
    slice_column: str | None
    """A column stored beside the features for per-slice evaluation only: a
    label-row column the model never sees, or one of its features."""
    holdout_start: str
    window_start: str = ""
    window_end: str = ""
    """The event-time window the rows came from, pinned (RFC 3339): rebuilding
    the data set from it later yields the same rows even after newer data
    arrives, which is what the optimiser and the drift job rely on."""
    task: str = "binary"
    classes: list[str] = field(default_factory=list)
    """Multiclass: the label values in the model's output order."""
    entities: list[str] = field(default_factory=list)
    """The entity join keys of the feature views."""
    request_columns: list[str] = field(default_factory=list)
    """The request-time columns of the on-demand feature views."""
    store: str = ""
    """The StoreLocation (JSON) the rows were read from."""
    view_hashes: dict[str, str] = field(default_factory=dict)
    """Feature view name (and "(labels)") -> a content hash of the values it
    gave these rows: what names a drifted view when the data set is rebuilt."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DatasetInfo":
        return cls(**json.loads(text))


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def time_split(frame: pd.DataFrame, holdout_fraction: float) -> pd.DataFrame:
    """Mark the most recent rows (by event time) as hold-out: the model is
    judged on data from after what it learned from, as in production."""
    frame = frame.sort_values("event_timestamp", kind="stable").reset_index(drop=True)
    cut = int(round(len(frame) * (1 - holdout_fraction)))
    frame[SPLIT] = ["train"] * cut + ["holdout"] * (len(frame) - cut)
    return frame


MAX_CLASSES = 1000


def label_classes(task: str, label: pd.Series, column: str) -> list[str]:
    """Check the label fits the task; multiclass: its classes in output order.
    A label of the wrong kind names the field and what would fit."""
    field_name = f"spec.features.labels.column '{column}'"
    values = label.dropna().unique()
    if label.isna().any():
        raise ValueError(f"{field_name} has {int(label.isna().sum())} empty labels: drop or fill them at the source")
    if task == "binary":
        if not set(pd.Series(values).astype(str)) <= {"0", "1", "True", "False", "0.0", "1.0"}:
            shown = ", ".join(map(str, sorted(values, key=str)[:5]))
            raise ValueError(f"{field_name} holds {shown}: task binary needs labels 0 and 1; use task multiclass "
                             "for classes or regression for values")
        return []
    if task == "regression":
        if not pd.api.types.is_numeric_dtype(label) or pd.api.types.is_bool_dtype(label):
            raise ValueError(f"{field_name} is of type {label.dtype}: task regression needs numeric labels")
        return []
    classes = sorted({str(v) for v in values}, key=lambda v: (len(v), v) if v.isdigit() else (0, v))
    if not 2 <= len(classes) <= MAX_CLASSES:
        raise ValueError(f"{field_name} has {len(classes)} distinct values: task multiclass needs 2 to "
                         f"{MAX_CLASSES} classes")
    return classes


def build_dataset(spec: TrainingJobSpec, store: str, output: Path) -> DatasetInfo:
    """The job's labelled rows joined with its features, split by time; store
    is the StoreLocation (JSON) of the feature store to read. Sources in
    object storage are read without s3fs, which no kubeloop image has."""
    # Feast takes seconds to import; only this step needs it.
    from kubeloop.featurestore.job import serve_s3_through_pyarrow
    from kubeloop.featurestore.store import LabelRows, StoreLocation, training_data

    serve_s3_through_pyarrow()
    data = training_data(
        StoreLocation.from_json(store), spec.features.feature_views,
        LabelRows.of(spec.features.labels),
        _parse_time(spec.features.window.start), _parse_time(spec.features.window.end),
        spec.evaluation.slice_column, keep_missing=True,
    )
    frame = data.frame
    if len(frame) < 100:
        raise ValueError(f"only {len(frame)} labelled rows remain after the point-in-time join "
                         f"({data.dropped_by_ttl} dropped by ttl): widen spec.features.window")
    classes = label_classes(spec.task, frame[data.label], data.label)
    slice_column = spec.evaluation.slice_column
    frame = time_split(frame, spec.evaluation.holdout_fraction)
    # Features without a value stay NaN in the file, for the validation step
    # to count; load_split gives the steps that learn MISSING_VALUE instead.
    # A slice may be the label or a feature itself: each column is written once.
    keep = list(dict.fromkeys([*data.feature_columns, data.label, "event_timestamp", SPLIT,
                               *([slice_column] if slice_column else [])]))
    frame[keep].to_parquet(output, index=False)
    holdout = frame[frame[SPLIT] == "holdout"]
    positives = int(frame[data.label].astype(float).sum()) if spec.task == "binary" else 0
    return DatasetInfo(
        entity_rows=data.entity_rows, dropped_by_ttl=data.dropped_by_ttl, rows=len(frame),
        train_rows=len(frame) - len(holdout), holdout_rows=len(holdout),
        positives=positives, dataset_hash=data.dataset_hash,
        feature_columns=data.feature_columns, label=data.label, feature_views=data.feature_views,
        slice_column=slice_column, holdout_start=str(holdout["event_timestamp"].min()),
        window_start=spec.features.window.start or frame["event_timestamp"].min().isoformat(),
        window_end=spec.features.window.end
        or (frame["event_timestamp"].max() + pd.Timedelta(microseconds=1)).isoformat(),
        task=spec.task, classes=classes, entities=data.entities, request_columns=data.request_columns, store=store,
        view_hashes=data.view_hashes,
    )


def pinned(spec: TrainingJobSpec, info: DatasetInfo) -> TrainingJobSpec:
    """The spec with its time window fixed to the rows it was trained on."""
    if not info.window_start:
        return spec
    window = spec.features.window.model_copy(update={"start": info.window_start, "end": info.window_end})
    features = spec.features.model_copy(update={"window": window})
    return spec.model_copy(update={"features": features})


def target(info: DatasetInfo, label: pd.Series) -> np.ndarray:
    """The label as the model learns it: 0/1 floats, class indices (in the
    order of info.classes), or float values."""
    if info.task == "multiclass":
        index = {c: i for i, c in enumerate(info.classes)}
        return label.astype(str).map(index).to_numpy(np.int64)
    return label.astype(float).to_numpy(np.float32)


def model_inputs(frame: pd.DataFrame, info: DatasetInfo) -> pd.DataFrame:
    """The rows with their features as the model sees them: a feature the
    store had no value for is MISSING_VALUE (the file keeps it NaN)."""
    return frame.fillna({c: MISSING_VALUE for c in info.feature_columns})


def load_split(path: Path, info: DatasetInfo, split: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows of one split with the features as the model sees them
    (model_inputs), and their targets (see target)."""
    frame = pd.read_parquet(path)
    part = model_inputs(frame[frame[SPLIT] == split], info)
    return part, target(info, part[info.label])
