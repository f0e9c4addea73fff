"""Drive Feast through its Python API: create a repository, apply the
definitions, materialise to the online store, and read point-in-time
correct training data without losing rows silently."""

from __future__ import annotations

import hashlib
import logging
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from kubeloop.featurestore.generate import Scenario, default_start, write

log = logging.getLogger(__name__)
TEMPLATE = Path(__file__).with_name("feature_store.yaml")
ENTITY_KEYS = ("card_id", "merchant_id")
REQUEST_COLUMNS = ("amount", "hour", "channel")


def create_repository(directory: Path, scenario: Scenario | None = None) -> Path:
    """A feature repository with generated data, definitions applied."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TEMPLATE, directory / "feature_store.yaml")
    write(scenario or Scenario(start=default_start(45)), directory / "data")
    apply(directory)
    return directory


def feature_store(repo: Path):  # noqa: ANN201 - feast.FeatureStore, imported lazily (slow import)
    from feast import FeatureStore

    return FeatureStore(repo_path=str(repo))


def apply(repo: Path) -> list[str]:
    """Register entities, sources and feature views in the repository's registry."""
    from kubeloop.featurestore import definitions

    store = feature_store(repo)
    objects = [*definitions.ENTITIES, *definitions.DATA_SOURCES, *definitions.FEATURE_VIEWS,
               *definitions.ON_DEMAND_FEATURE_VIEWS]
    store.apply(objects)
    return [getattr(o, "name", str(o)) for o in objects]


def materialize(repo: Path, end: datetime | None = None) -> datetime:
    """Load the latest feature values into the online store, up to end."""
    end = end or datetime.now(timezone.utc)
    feature_store(repo).materialize_incremental(end_date=end)
    return end


def append_period(repo: Path, scenario: Scenario) -> dict[str, int]:
    """Add a newer period of data (for example a drifted one) to every source."""
    staging = repo / "data" / ".incoming"
    counts = write(scenario, staging)
    for name in counts:
        target = repo / "data" / f"{name}.parquet"
        combined = pd.concat([pd.read_parquet(target), pd.read_parquet(staging / f"{name}.parquet")],
                             ignore_index=True)
        if name == "transactions":
            combined["transaction_id"] = range(1, len(combined) + 1)
        if name == "card_profile":
            combined = combined.drop_duplicates("card_id", keep="first")
        combined.to_parquet(target, index=False)
    shutil.rmtree(staging)
    return counts


@dataclass
class TrainingData:
    """Labelled rows with their point-in-time features, and what was lost."""

    frame: pd.DataFrame
    feature_columns: list[str]
    label: str
    entity_rows: int
    dropped_by_ttl: int
    feature_views: dict[str, str] = field(default_factory=dict)
    """Feature view name -> a fingerprint of its definition (schema, ttl, source)."""

    @property
    def dataset_hash(self) -> str:
        """Content hash of the exact rows and columns the model sees."""
        columns = sorted([*self.feature_columns, self.label, "event_timestamp"])
        digest = pd.util.hash_pandas_object(self.frame[columns].sort_values(columns), index=False)
        return hashlib.sha256(digest.values.tobytes() + ",".join(columns).encode()).hexdigest()[:16]


def training_data(repo: Path, feature_views: list[str], label_source: str, label: str,
                  start: datetime | None = None, end: datetime | None = None) -> TrainingData:
    """Entity rows from the label source, joined point-in-time with the views.

    Feast's file offline store drops entity rows whose feature rows are older
    than a view's ttl; the count of those rows is returned, never hidden.
    """
    store = feature_store(repo)
    source = store.get_data_source(label_source)
    path = Path(source.path) if Path(source.path).is_absolute() else repo / source.path
    rows = pd.read_parquet(path)
    ts = source.timestamp_field
    if start is not None:
        rows = rows[rows[ts] >= pd.Timestamp(start)]
    if end is not None:
        rows = rows[rows[ts] < pd.Timestamp(end)]
    missing = [c for c in (label, *ENTITY_KEYS) if c not in rows.columns]
    if missing:
        raise ValueError(f"label source {label_source} has no column {', '.join(missing)}")
    entity_df = rows[[*ENTITY_KEYS, *REQUEST_COLUMNS, label, ts]].rename(columns={ts: "event_timestamp"})

    refs, fingerprints = [], {}
    for name in feature_views:
        view = _view(store, name)
        fingerprints[name] = hashlib.sha256(view.to_proto().spec.SerializeToString()).hexdigest()[:12]
        refs += [f"{name}:{f.name}" for f in view.features]
    frame = store.get_historical_features(entity_df=entity_df, features=refs).to_df()
    dropped = len(entity_df) - len(frame)
    if dropped:
        log.warning("the offline store dropped %d of %d entity rows (feature rows older than a view's ttl)",
                    dropped, len(entity_df))
    columns = [r.split(":", 1)[1] for r in refs]
    numeric = [c for c in columns if pd.api.types.is_numeric_dtype(frame[c])]
    frame = frame.sort_values("event_timestamp", kind="stable").reset_index(drop=True)
    frame[numeric] = frame[numeric].astype("float64").fillna(0.0)
    return TrainingData(frame=frame, feature_columns=numeric, label=label, entity_rows=len(entity_df),
                        dropped_by_ttl=dropped, feature_views=fingerprints)


def _view(store, name: str):  # noqa: ANN001, ANN202 - feast objects
    from feast.errors import FeatureViewNotFoundException

    try:
        return store.get_feature_view(name)
    except FeatureViewNotFoundException:
        pass
    try:
        return store.get_on_demand_feature_view(name)
    except Exception:  # feast raises different types per registry backend
        views = sorted(v.name for v in store.list_feature_views()) + sorted(
            v.name for v in store.list_on_demand_feature_views())
        raise ValueError(f"feature view '{name}' does not exist in project {store.project}; "
                         f"known views: {', '.join(views)}") from None
