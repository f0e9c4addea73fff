"""Drive Feast through its Python API: open any team's feature store, read
point-in-time correct training data without losing rows silently, and (for
the demo's own repository only) create, apply and materialise.

A store is named by a StoreLocation: a repository folder (the operator's
default store) or the text of a `feature_store.yaml`, the form Feast's own
operator publishes to clients (for example the client ConfigMap of a Feast
FeatureStore). kubeloop only reads a user's store: it never applies
definitions to it or writes into it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import yaml

from kubeloop.api.signature import MISSING_VALUE
from kubeloop.featurestore.freshness import Materialized, StoreNeed
from kubeloop.featurestore.generate import Scenario, default_start, write

log = logging.getLogger(__name__)
TEMPLATE = Path(__file__).with_name("feature_store.yaml")


@dataclass(frozen=True)
class StoreLocation:
    """Where a Feast store is: a repository folder, or feature_store.yaml text
    (its paths absolute, or remote stores)."""

    path: str | None = None
    config: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.config is None):
            raise ValueError("a feature store location is a repository path or a feature_store.yaml text, not both")

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "StoreLocation":
        return cls(**json.loads(text))

    @classmethod
    def resolve(cls, named: str, default_repo: str, mounted: str = "") -> "StoreLocation":
        """The store a pipeline step reads: the job's own, as a feature_store.yaml
        mounted into the step (mounted, its path) or as StoreLocation JSON
        (named), else the operator's default repository. A mounted file is
        read as text: the location the step records (kubeloop.feature_store)
        must mean the same store outside the step's Pod."""
        if mounted:
            return cls(config=Path(mounted).read_text())
        if named:
            return cls.from_json(named)
        if not default_repo:
            raise ValueError("spec.features.store names no feature store and the operator has no default "
                             "(KUBELOOP_FEAST_REPO): name a store's feature_store.yaml ConfigMap")
        return cls(path=default_repo)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256((self.config or self.path or "").encode()).hexdigest()[:12]


def _as_location(location: StoreLocation | Path | str) -> StoreLocation:
    return location if isinstance(location, StoreLocation) else StoreLocation(path=str(location))


def open_store(location: StoreLocation | Path | str):  # noqa: ANN201 - feast.FeatureStore (slow import)
    """A FeatureStore for the location. feature_store.yaml text is written
    into a private folder of this process (keyed by its content) that Feast
    treats as the repository: nothing is written where the store lives."""
    location = _as_location(location)
    if location.path is not None:
        return _serving_while_materializing(location.path)
    folder = Path(tempfile.gettempdir()) / f"kubeloop-feast-{location.fingerprint}"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "feature_store.yaml"
    if not target.exists() or target.read_text() != location.config:
        tmp = folder / f".feature_store.{id(location)}.yaml"
        tmp.write_text(location.config)
        tmp.replace(target)
    return _serving_while_materializing(str(folder))


def _serving_while_materializing(repo: str):  # noqa: ANN202 - feast.FeatureStore
    """Feast refuses every read of a feature view, point-in-time ones too,
    while a materialisation marks it MATERIALIZING, and leaves the mark on a
    run that was killed. The operator materialises on a schedule alongside
    training and serving, so its readers take the values last materialised,
    and a local file registry is written whole (registry_file)."""
    from feast import FeatureStore
    from feast.repo_config import load_repo_config

    from kubeloop.featurestore.registry_file import CLASS_PATH, uses_file_store

    config = load_repo_config(Path(repo), Path(repo) / "feature_store.yaml")
    config.registry.serve_features_while_materializing = True
    if uses_file_store(config.registry):
        config.registry.registry_store_type = CLASS_PATH
    return FeatureStore(repo_path=repo, config=config)


def online_store_config(redis_address: str = "") -> dict:
    """The online_store section of the example's feature_store.yaml: Redis
    at host:port, else sqlite in the repository's data folder."""
    if redis_address:
        return {"type": "redis", "connection_string": redis_address}
    return {"type": "sqlite", "path": "data/online.db"}


def create_repository(directory: Path, scenario: Scenario | None = None, redis_address: str = "",
                      registry: str = "") -> Path:
    """A feature repository with generated data, definitions applied; its
    online store in Redis at redis_address (host:port), else sqlite; its
    registry at registry (an s3:// URI, for clients elsewhere), else a file
    in the repository."""
    directory.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(TEMPLATE.read_text())
    config["online_store"] = online_store_config(redis_address)
    if registry:
        config["registry"] = registry
    (directory / "feature_store.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    write(scenario or Scenario(start=default_start(45)), directory / "data")
    apply(directory)
    return directory


EXAMPLE_PROJECT = "kubeloop_fraud"


def apply(repo: Path) -> list[str]:
    """Register the card-transactions example's entities, sources and feature
    views in its repository. Refused for any other project: a team's
    repository is the team's to apply (`feast apply`), never kubeloop's."""
    from kubeloop.featurestore import definitions

    store = open_store(repo)
    if store.project != EXAMPLE_PROJECT:
        raise ValueError(f"{repo} is Feast project {store.project}, not the card-transactions example "
                         f"({EXAMPLE_PROJECT}): kubeloop applies definitions only to its own example repository")
    objects = [*definitions.ENTITIES, *definitions.DATA_SOURCES, *definitions.FEATURE_VIEWS,
               *definitions.ON_DEMAND_FEATURE_VIEWS]
    store.apply(objects)
    return [getattr(o, "name", str(o)) for o in objects]


def materialize(repo: Path, end: datetime | None = None) -> datetime:
    """Load the latest feature values into the online store, up to end."""
    end = end or datetime.now(timezone.utc)
    open_store(repo).materialize_incremental(end_date=end)
    return end


def materialize_views(need: StoreNeed, end: float) -> Materialized:
    """Feast's incremental materialisation, up to end (Unix time), of the
    feature views that serve the views a service reads online (an on-demand
    view is computed from the feature views it reads), each on its own. What the registry
    records afterwards comes back whether the run worked or not, so the lag
    stays true through failures and operator restarts."""
    store = open_store(StoreLocation.from_json(need.store))
    names = online_views(store, list(need.views))
    errors = []
    for name in names:  # one view at a time: a broken source leaves the others fresh
        try:
            store.materialize_incremental(end_date=datetime.fromtimestamp(end, timezone.utc), feature_views=[name])
        except Exception as exc:  # noqa: BLE001 - a team's store fails in its own ways (files, credentials, schema)
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    # A fresh FeatureStore: the registry as written, not as this one cached it.
    return Materialized(store.project, materialized_until(open_store(StoreLocation.from_json(need.store)), names),
                        "; ".join(errors) or None)


def online_views(store, views: list[str]) -> list[str]:  # noqa: ANN001 - feast.FeatureStore
    """The feature views to materialise for views read online: feature
    views as they are, on-demand views by the feature views they read."""
    from feast.on_demand_feature_view import OnDemandFeatureView

    names: list[str] = []
    for view in (feature_view(store, name) for name in views):
        if isinstance(view, OnDemandFeatureView):
            names += [p.name for p in view.source_feature_view_projections.values()]
        else:
            names.append(view.name)
    return list(dict.fromkeys(names))


def materialized_until(store, names: list[str]) -> dict[str, float | None]:  # noqa: ANN001 - feast.FeatureStore
    """View -> the end of its last materialised interval (Unix time), read
    from the registry, so it survives an operator restart."""
    ends = {}
    for name in names:
        end = store.get_feature_view(name).most_recent_end_time
        if end is not None and end.tzinfo is None:
            end = end.replace(tzinfo=timezone.utc)  # Feast records UTC
        ends[name] = end.timestamp() if end is not None else None
    return ends


def write_period(repo: Path, scenario: Scenario) -> dict[str, int]:
    """Write the scenario's period into every source: rows from its start on
    are replaced by its own (when the data ends before it starts, an
    append). A card's profile stays the one it had."""
    staging = repo / "data" / ".incoming"
    counts = write(scenario, staging)
    start = pd.Timestamp(scenario.start)
    for name in counts:
        target = repo / "data" / f"{name}.parquet"
        kept = pd.read_parquet(target)
        if name != "card_profile":
            kept = kept[kept["event_timestamp"] < start]
        combined = pd.concat([kept, pd.read_parquet(staging / f"{name}.parquet")], ignore_index=True)
        if name == "transactions":
            combined["transaction_id"] = range(1, len(combined) + 1)
        if name == "card_profile":
            combined = combined.drop_duplicates("card_id", keep="first")
        combined.to_parquet(target, index=False)
    shutil.rmtree(staging)
    return counts


def recent_period(days: int = 14, drift: float = 1.0, seed: int = 11, now: datetime | None = None,
                  concept: float = 0.0) -> Scenario:
    """The last `days` up to now in a world of their own (drifted by
    default; `concept` moves the labels alone): written with write_period,
    they replace what the sources held for those days, and their snapshots
    as of now are newer than anything materialised, so the next incremental
    materialisation serves them."""
    end = now or datetime.now(timezone.utc)
    return Scenario(start=end - timedelta(days=days), days=days, drift=drift, seed=seed, snapshot_at_end=True,
                    concept=concept)


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
    entities: list[str] = field(default_factory=list)
    """The entity join keys of the views."""
    request_columns: list[str] = field(default_factory=list)
    """The request-time columns of the on-demand views."""
    view_columns: dict[str, list[str]] = field(default_factory=dict)
    """Feature view name -> the columns of the frame it contributed."""

    @property
    def dataset_hash(self) -> str:
        """Content hash of the exact rows and columns the model sees."""
        return content_hash(self._as_seen(), [*self.feature_columns, self.label, "event_timestamp"])

    def _as_seen(self) -> pd.DataFrame:
        """The rows with gaps as the value the model sees, whether or not the frame kept them."""
        return self.frame.fillna({c: MISSING_VALUE for c in self.feature_columns})

    @property
    def view_hashes(self) -> dict[str, str]:
        """A content hash per view of the values it gave these rows (and one
        of the labels): when the dataset hash changes while every definition
        fingerprint stays, these name the view whose data changed."""
        rows = [*self.entities, *self.request_columns, "event_timestamp"]
        parts = {**self.view_columns, LABELS: [self.label]}
        seen = self._as_seen()
        return {name: content_hash(seen, [*rows, *columns]) for name, columns in parts.items()}


LABELS = "(labels)"
"""view_hashes' entry for the label rows themselves (no view has this name: Feast names are identifiers)."""


def content_hash(frame: pd.DataFrame, columns: list[str]) -> str:
    """Hash of the values of the columns, independent of row and column order."""
    columns = sorted(dict.fromkeys(c for c in columns if c in frame.columns))
    digest = pd.util.hash_pandas_object(frame[columns].sort_values(columns), index=False)
    return hashlib.sha256(digest.values.tobytes() + ",".join(columns).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LabelRows:
    """Where labelled entity rows come from: a data source of the store, or a
    file the user names, with its label and event-time columns."""

    column: str
    source: str | None = None
    path: str | None = None
    timestamp_column: str | None = None

    @classmethod
    def of(cls, labels) -> "LabelRows":  # noqa: ANN001 - kubeloop.api.training.LabelSource
        return cls(labels.column, labels.source, labels.path, labels.timestamp_column)


def join_columns(store, views: list) -> tuple[list[str], list[str]]:  # noqa: ANN001 - feast objects
    """The entity join keys and request-time columns the views need, read off
    their definitions: feature views' entities, on-demand views' request
    sources and the feature views they build on."""
    from feast.on_demand_feature_view import OnDemandFeatureView

    keys: list[str] = []
    request: list[str] = []
    for view in views:
        if isinstance(view, OnDemandFeatureView):
            request += [f.name for s in view.source_request_sources.values() for f in s.schema]
            for projection in view.source_feature_view_projections.values():
                base = store.get_feature_view(projection.name)
                keys += [projection.join_key_map.get(k, k) for k in base.join_keys]
        else:
            keys += view.join_keys
    return list(dict.fromkeys(keys)), list(dict.fromkeys(request))


def _relative(path: str) -> bool:
    return not Path(path).is_absolute() and "://" not in path


def _label_source(store, name: str):  # noqa: ANN001, ANN202 - feast objects
    """The file data source the label rows come from, by name."""
    from feast import FileSource

    try:
        source = store.get_data_source(name)
    except Exception:  # feast raises different types per registry backend
        known = sorted(s.name for s in store.list_data_sources())
        raise ValueError(f"spec.features.labels.source '{name}' is not a data source of feature store "
                         f"project {store.project}; known sources: {', '.join(known)}") from None
    if not isinstance(source, FileSource):
        raise ValueError(f"spec.features.labels.source '{name}' is a {type(source).__name__}; kubeloop "
                         "reads labels from file sources: name a file source or a file in labels.path")
    return source


def _label_frame(store, labels: LabelRows, source) -> tuple[pd.DataFrame, str, str]:  # noqa: ANN001
    """The label rows (from the label source, else labels.path), the
    timestamp column, and what to call them in errors."""
    if source is None:
        if not labels.timestamp_column:
            raise ValueError("spec.features.labels.timestampColumn is required with labels.path")
        return pd.read_parquet(labels.path), labels.timestamp_column, f"label file {labels.path}"
    path = Path(store.repo_path) / source.path if _relative(source.path) else source.path
    return pd.read_parquet(path), labels.timestamp_column or source.timestamp_field, f"label source {labels.source}"


def _batch_sources(store, views: list) -> list:  # noqa: ANN001 - feast objects
    """The offline sources a point-in-time read of the views scans: each
    feature view's own, an on-demand view's through the feature views it reads."""
    from feast.on_demand_feature_view import OnDemandFeatureView

    sources = []
    for view in views:
        if isinstance(view, OnDemandFeatureView):
            sources += [store.get_feature_view(p.name).batch_source
                        for p in view.source_feature_view_projections.values()]
        else:
            sources.append(view.batch_source)
    return sources


def _check_published_paths(store, location: StoreLocation, sources: list) -> None:  # noqa: ANN001 - feast objects
    """A published feature_store.yaml has no repository folder for a relative
    file path to be relative to: Feast would look beside kubeloop's private
    copy of the text (open_store) and fail naming a folder the user never
    made, deep inside the first read."""
    from feast import FileSource

    if location.config is None:
        return
    relative = {s.name: s.path for s in sources if isinstance(s, FileSource) and _relative(s.path)}
    if relative:
        shown = ", ".join(f"'{name}' ({path})" for name, path in sorted(relative.items()))
        raise ValueError(
            f"spec.features.store: the published feature store (project {store.project}) has file data sources "
            f"with relative paths, which resolve only inside the repository they were applied from: {shown}; "
            "give each an absolute path or an object-store URI (for example s3://bucket/file.parquet) in the "
            "repository's definitions and run `feast apply` again")


def _carried_slice(column: str | None, rows: pd.DataFrame, views: list, what: str) -> list[str]:
    """The label-row column to carry through the join for per-slice
    evaluation only (a region, a sensitive attribute kept out of the model):
    a slice that is a feature comes out of the join anyway, and one that is
    neither fails here, before the join and any training."""
    features = [f.name for view in views for f in view.features]
    if column is None or column in features:
        return []
    if column in rows.columns:
        return [column]
    raise ValueError(f"spec.evaluation.sliceColumn '{column}' is neither a column of the {what} nor a feature of "
                     f"spec.features.featureViews; the {what} has {', '.join(map(str, rows.columns))}; the "
                     f"features are {', '.join(features)}")


def training_data(location: StoreLocation | Path | str, feature_views: list[str], labels: LabelRows,
                  start: datetime | None = None, end: datetime | None = None,
                  slice_column: str | None = None, keep_missing: bool = False) -> TrainingData:
    """Entity rows from the label rows, joined point-in-time with the views;
    slice_column, a label-row column or a feature, comes out beside the
    features, never among feature_columns. keep_missing: a feature with no
    value stays NaN (for data validation to count) instead of becoming
    MISSING_VALUE.

    Feast's file offline store drops entity rows whose feature rows are older
    than a view's ttl; the count of those rows is returned, never hidden.
    """
    location = _as_location(location)
    store = open_store(location)
    views = [feature_view(store, name) for name in feature_views]
    keys, request = join_columns(store, views)
    source = _label_source(store, labels.source) if labels.source else None
    _check_published_paths(store, location, [*_batch_sources(store, views), *([source] if source else [])])
    rows, ts, what = _label_frame(store, labels, source)
    missing = [c for c in (labels.column, ts, *keys, *request) if c not in rows.columns]
    if missing:
        raise ValueError(
            f"spec.features.labels: the {what} has no column {', '.join(missing)} (the label column, its event "
            f"time, and the join keys {keys} and request columns {request} the feature views need); its columns: "
            f"{', '.join(map(str, rows.columns))}")
    if start is not None:
        rows = rows[rows[ts] >= pd.Timestamp(start)]
    if end is not None:
        rows = rows[rows[ts] < pd.Timestamp(end)]
    if rows.empty:
        raise ValueError(f"spec.features.window: the {what} has no rows between {start or 'the start'} and "
                         f"{end or 'now'}; widen the window")
    carried = _carried_slice(slice_column, rows, views, what)
    entity_df = rows[list(dict.fromkeys([*keys, *request, labels.column, ts, *carried]))].rename(
        columns={ts: "event_timestamp"})
    fingerprints = {view.name: definition_fingerprint(view) for view in views}
    frame, numeric = point_in_time(store, views, entity_df, fill=not keep_missing)
    dropped = len(entity_df) - len(frame)
    if dropped:
        log.warning("the offline store dropped %d of %d entity rows (feature rows older than a view's ttl)",
                    dropped, len(entity_df))
    frame = frame.sort_values("event_timestamp", kind="stable").reset_index(drop=True)
    return TrainingData(frame=frame, feature_columns=numeric, label=labels.column, entity_rows=len(entity_df),
                        dropped_by_ttl=dropped, feature_views=fingerprints, entities=keys, request_columns=request,
                        view_columns={view.name: [f.name for f in view.features] for view in views})


TIMESTAMPS = ("created_timestamp", "last_updated_timestamp")


def definition_fingerprint(view) -> str:  # noqa: ANN001 - a feast (on-demand) feature view
    """What the view computes (schema, ttl, sources, transformation), not
    when Feast made its objects: the sources' timestamps are left out (a
    request source gets a new one on every read), an on-demand view's
    function counts by its source text (its pickled body differs between
    processes), and maps are serialised in key order (protobuf's default
    order varies between reads)."""
    spec = view.to_proto().spec
    _clear_timestamps(spec)
    return hashlib.sha256(spec.SerializeToString(deterministic=True)).hexdigest()[:12]


def _clear_timestamps(message) -> None:  # noqa: ANN001 - a protobuf message
    for described, value in message.ListFields():
        if described.name in TIMESTAMPS or (described.name == "body" and getattr(message, "body_text", "")):
            message.ClearField(described.name)
        elif described.message_type is None:
            continue
        elif described.message_type.GetOptions().map_entry:
            if described.message_type.fields_by_name["value"].message_type is not None:
                for item in value.values():
                    _clear_timestamps(item)
        elif described.label == described.LABEL_REPEATED:
            for item in value:
                _clear_timestamps(item)
        else:
            _clear_timestamps(value)


def point_in_time(store, views: list, entity_df: pd.DataFrame,  # noqa: ANN001
                  fill: bool = True) -> tuple[pd.DataFrame, list[str]]:
    """The views' features for the entity rows (their keys, request columns
    and event_timestamp; other columns pass through), point-in-time, with
    the numeric feature columns as the model sees them: float, a missing
    value being 0 (the training default; NaN without fill). Rows whose
    features are older than a view's ttl are missing from the answer
    (Feast's file offline store)."""
    refs = [f"{view.name}:{f.name}" for view in views for f in view.features]
    frame = store.get_historical_features(entity_df=entity_df, features=refs).to_df()
    columns = [r.split(":", 1)[1] for r in refs]
    numeric = [c for c in columns if pd.api.types.is_numeric_dtype(frame[c])]
    frame[numeric] = frame[numeric].astype("float64")
    if fill:
        frame[numeric] = frame[numeric].fillna(MISSING_VALUE)
    return frame, numeric


def feature_view(store, name: str):  # noqa: ANN001, ANN202 - feast objects
    """A feature view or on-demand feature view of the store, by name; an
    unknown name is a ValueError listing the known ones."""
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
        raise ValueError(f"spec.features.featureViews: '{name}' is not a feature view of project {store.project}; "
                         f"known views: {', '.join(views)}") from None
