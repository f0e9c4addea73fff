"""Online features for entity requests: a caller sends the entity keys and
request-time columns a model's signature names, the serving path reads the
rest from the Feast online store and hands Triton the vector in the order
the model was trained on.

Pure parts (parsing a KServe v2 request, assembling vectors, applying the
missing/stale policy) are separate from the one class that talks to Feast
(OnlineStore), so the same code runs in the local router and, on a cluster,
in a transformer in front of Triton.

The training default: the training data fills a feature the offline store
has no value for with MISSING_VALUE (kubeloop.api.signature), and a missing
or stale value served with policy "default" becomes the same.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal, Sequence

from kubeloop.api.signature import MISSING_VALUE as TRAINING_DEFAULT
from kubeloop.featurestore.freshness import published

Policy = Literal["default", "reject"]
VECTOR_INPUT, VECTOR_DATATYPE = "features", "FP32"
"""The tensor an entity request's vectors reach Triton as."""
log = logging.getLogger("kubeloop.features")
_PLACEHOLDERS = {"INT32": 0, "INT64": 0, "FLOAT": 0.0, "DOUBLE": 0.0, "STRING": "", "BOOL": False, "BYTES": b""}
"""A value of each scalar Feast value type, for the read that readies a store (OnlineStore)."""


@dataclass(frozen=True)
class FeatureSpec:
    """What a served version needs from the online store: its feature store
    (StoreLocation JSON), the views, entities and request columns of its
    signature, and its input columns in training order."""

    store: str
    views: tuple[str, ...]
    entities: tuple[str, ...]
    request_columns: tuple[str, ...]
    columns: tuple[str, ...]

    @classmethod
    def of(cls, signature, store: str) -> "FeatureSpec | None":  # noqa: ANN001 - ModelSignature
        """The spec of a version, or None when it cannot take entity requests
        (no feature views in its signature, or no recorded feature store)."""
        if not signature.feature_views or not store:
            return None
        return cls(store=store, views=tuple(signature.feature_views), entities=tuple(signature.entities),
                   request_columns=tuple(signature.request_columns), columns=tuple(signature.feature_columns))

    @property
    def published(self) -> bool:
        """Whether the store was recorded as feature_store.yaml text (what
        Feast's operator publishes to clients, openable from any Pod that
        reaches its registry and online store), not a repository folder."""
        return published(self.store)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The columns a caller sends."""
        return (*self.entities, *self.request_columns)

    @cached_property
    def expected(self) -> frozenset[str]:
        """inputs, as the names of a request's tensors."""
        return frozenset(self.inputs)

    def to_dict(self) -> dict:
        return {"store": self.store, "views": list(self.views), "entities": list(self.entities),
                "request_columns": list(self.request_columns), "columns": list(self.columns)}

    @classmethod
    def from_dict(cls, data: dict) -> "FeatureSpec":
        return cls(store=data["store"], views=tuple(data["views"]), entities=tuple(data["entities"]),
                   request_columns=tuple(data["request_columns"]), columns=tuple(data["columns"]))


class RequestError(ValueError):
    """A request the serving path refuses, with the HTTP status to answer."""

    def __init__(self, status: int, message: str, problems: Sequence["Problem"] = ()):
        super().__init__(message)
        self.status = status
        self.problems = list(problems)
        """The missing or stale values behind a refusal."""


@dataclass(frozen=True)
class ViewInfo:
    """A feature view as the policy sees it: its features, the join keys
    that find its rows (none for on-demand views, which are computed) and its
    ttl (0: values never go stale)."""

    name: str
    features: tuple[str, ...]
    join_keys: tuple[str, ...] = ()
    ttl_seconds: float = 0.0


@dataclass
class Retrieved:
    """What the online store answered for n rows."""

    values: dict[str, list]
    """Feature name -> one value per row (None where there is none)."""
    found: dict[str, list[bool]] = field(default_factory=dict)
    """Stored view -> per row, whether the store had its entity."""
    timestamps: dict[str, list[float | None]] = field(default_factory=dict)
    """Stored view -> per row, the event time of its value (epoch seconds)."""


def concat_rows(requests: Sequence[dict[str, list]]) -> tuple[dict[str, list], list[tuple[int, int]]]:
    """Several requests' columns (the same columns each) as one set of rows,
    and where each request's rows lie in it."""
    joined: dict[str, list] = {name: [] for name in requests[0]}
    spans = []
    for request in requests:
        start = len(next(iter(joined.values())))
        for name, column in request.items():
            joined[name].extend(column)
        spans.append((start, start + len(next(iter(request.values())))))
    return joined, spans


@dataclass(frozen=True)
class Problem:
    """A view's value a row could not have: unknown entity, or past its ttl."""

    view: str
    row: int
    reason: Literal["missing", "stale"]
    entity: str
    """The entity, as join key=value pairs."""
    age_seconds: float | None = None

    def describe(self, ttl_seconds: float = 0.0) -> str:
        if self.reason == "missing":
            return f"{self.entity} is not in the online store (feature view {self.view})"
        return (f"{self.entity}: feature view {self.view} holds a value {self.age_seconds / 3600:.1f} h old, "
                f"past its ttl of {ttl_seconds / 3600:.1f} h")


@dataclass
class Assembled:
    """The model's input rows, and the values that were missing or stale."""

    vectors: list[list[float]]
    problems: list[Problem]
    joined: int = 1
    """The requests whose rows the read that answered this carried."""


def is_entity_request(payload: dict, input_name: str = VECTOR_INPUT) -> bool:
    """Whether a v2 request carries columns rather than the model's input tensor."""
    inputs = payload.get("inputs")
    return isinstance(inputs, list) and bool(inputs) and all(
        isinstance(t, dict) and t.get("name") != input_name for t in inputs)


def parse_rows(payload: dict, spec: FeatureSpec) -> dict[str, list]:
    """Column -> one value per row, from the v2 input tensors named by the
    spec's entities and request columns (shape [n] or [n, 1]). Unknown or
    missing columns, and columns of different lengths, are refused (400)."""
    tensors = {t.get("name"): t for t in payload["inputs"]}
    if tensors.keys() != spec.expected:
        missing = [c for c in spec.inputs if c not in tensors]
        if missing:
            raise RequestError(400, f"the request lacks the input {', '.join(missing)}: an entity request carries "
                                    f"{', '.join(spec.inputs)} (one tensor each, shape [rows])")
        unknown = sorted(str(n) for n in tensors if n not in spec.inputs)
        raise RequestError(400, f"unknown input {', '.join(unknown)}: this model takes {', '.join(spec.inputs)}, "
                                "or the whole vector as the tensor 'features'")
    rows = {name: _column(tensors[name]) for name in spec.inputs}
    lengths = {len(values) for values in rows.values()}
    if len(lengths) != 1 or not next(iter(lengths)):
        raise RequestError(400, "every input needs the same number of rows (at least one): got "
                                + ", ".join(f"{k} {len(v)}" for k, v in rows.items()))
    return rows


def flat_values(data: list) -> list:
    """A v2 tensor's values in order, whether its data is flat or nested by row."""
    return [v for row in data for v in row] if data and isinstance(data[0], list) else data


def _column(tensor: dict) -> list:
    data = tensor.get("data")
    shape = tensor.get("shape")
    if type(data) is list and shape == [len(data)] and (not data or type(data[0]) is not list):
        return data  # shape [rows], flat: what nearly every caller sends, checked in one step
    if not isinstance(data, list):
        raise RequestError(400, f"input {tensor.get('name')}: data must be a list")
    flat = flat_values(data)
    if not isinstance(shape, list) or not shape or math.prod(shape) != len(flat) or any(s != 1 for s in shape[1:]):
        raise RequestError(400, f"input {tensor.get('name')}: shape {shape} does not fit {len(flat)} values "
                                "(an entity request's inputs are columns: shape [rows] or [rows, 1])")
    return flat


def find_problems(views: Sequence[ViewInfo], rows: dict[str, list], retrieved: Retrieved,
                  now: float) -> list[Problem]:
    """Every (stored view, row) whose entity the store lacks or whose value is
    older than the view's ttl at `now` (epoch seconds)."""
    problems = []
    for view in views:
        found = retrieved.found.get(view.name)
        if found is None:
            continue
        times = retrieved.timestamps.get(view.name) or [None] * len(found)
        ttl = view.ttl_seconds
        for i, (present, at) in enumerate(zip(found, times, strict=True)):
            if not present:
                problems.append(Problem(view.name, i, "missing", _entity(view, rows, i)))
            elif ttl and at is not None and now - at > ttl:
                problems.append(Problem(view.name, i, "stale", _entity(view, rows, i), now - at))
    return problems


def _entity(view: ViewInfo, rows: dict[str, list], i: int) -> str:
    """Row i's entity of the view, as join key=value pairs."""
    return ", ".join(f"{k}={rows[k][i]}" for k in view.join_keys if k in rows)


def assemble(spec: FeatureSpec, views: Sequence[ViewInfo], rows: dict[str, list], retrieved: Retrieved,
             now: float, policy: Policy) -> Assembled:
    """The model's input rows in training order. Missing or stale values
    follow the policy: default puts the training default in their place,
    reject refuses the request (422) naming the entities and views."""
    return judged(_filled(spec, views, rows, retrieved, now), views, policy)


def assemble_each(spec: FeatureSpec, views: Sequence[ViewInfo], rows: dict[str, list], spans: Sequence[tuple[int, int]],
                  retrieved: Retrieved, now: float, policy: Policy) -> list[Assembled | RequestError]:
    """What assemble answers each request of a joined read (spans: where
    each request's rows lie in rows), or its refusal. Filled once for the
    whole read: assembled a request at a time, the vectors were a quarter of
    the CPU of a read that carried five one-row requests."""
    whole = _filled(spec, views, rows, retrieved, now)
    out: list[Assembled | RequestError] = []
    for start, stop in spans:
        problems = [replace(p, row=p.row - start) for p in whole.problems if start <= p.row < stop]
        try:
            out.append(judged(Assembled(whole.vectors[start:stop], problems, len(spans)), views, policy))
        except RequestError as exc:
            out.append(exc)
    return out


def judged(assembled: Assembled, views: Sequence[ViewInfo], policy: Policy) -> Assembled:
    """The assembled rows, or the refusal (422) the policy reject gives rows with problems."""
    problems = assembled.problems
    if problems and policy == "reject":
        ttl = {v.name: v.ttl_seconds for v in views}
        shown = "; ".join(p.describe(ttl[p.view]) for p in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise RequestError(422, f"{shown}{more}; spec.features.missing is reject", problems)
    return assembled


def _filled(spec: FeatureSpec, views: Sequence[ViewInfo], rows: dict[str, list], retrieved: Retrieved,
            now: float) -> Assembled:
    """The rows in training order, the training default wherever a value is missing or stale."""
    problems = find_problems(views, rows, retrieved, now)
    columns = []
    for j, column in enumerate(spec.columns):
        values = retrieved.values.get(column)
        if values is None:
            raise RequestError(500, f"the online store answered no feature {column} (the model's input {j}): "
                                    f"are the feature views {', '.join(spec.views)} the ones it was trained on?")
        columns.append(_numbers(values))
    if problems:
        _blank(spec, columns, views, problems)
    if not columns:
        return Assembled([[] for _ in next(iter(rows.values()))], problems)
    return Assembled([list(row) for row in zip(*columns, strict=True)], problems)


def _blank(spec: FeatureSpec, columns: list[list[float]], views: Sequence[ViewInfo],
           problems: list[Problem]) -> None:
    """Put the training default where a row's view has no value to serve."""
    owner = {f: v.name for v in views for f in v.features}
    for problem in problems:
        for j in (j for j, c in enumerate(spec.columns) if owner.get(c) == problem.view):
            columns[j][problem.row] = TRAINING_DEFAULT


def _numbers(values: list) -> list[float]:
    """Feature values as Feast returns them, as numbers: the training default for none or NaN."""
    out = []
    for value in values:
        if value is None:
            out.append(TRAINING_DEFAULT)
        else:
            number = float(value)
            out.append(TRAINING_DEFAULT if number != number else number)  # NaN is the only value unequal to itself
    return out


def placeholder_row(columns: Sequence[str], types: dict[str, str]) -> dict[str, list] | None:
    """One row of the columns a caller sends, each a placeholder of its Feast
    value type (types: column -> ValueType name); None when there are no
    columns, or a column's type is unknown or has no placeholder (pure)."""
    if not columns or not all(types.get(c) in _PLACEHOLDERS for c in columns):
        return None
    return {c: [_PLACEHOLDERS[types[c]]] for c in columns}


def tensor_request(vectors: list[list[float]], input_name: str = VECTOR_INPUT, request_id: str | None = None) -> dict:
    """The v2 request Triton takes: the vectors as one FP32 tensor."""
    body = {"inputs": [{"name": input_name, "shape": [len(vectors), len(vectors[0]) if vectors else 0],
                        "datatype": VECTOR_DATATYPE, "data": vectors}]}
    if request_id:
        body["id"] = request_id
    return body


class OnlineStore:
    """Reads a FeatureSpec's views from its Feast online store (the I/O half
    of this module). Opening it imports Feast and reads the registry: do it
    once per spec, before requests arrive."""

    def __init__(self, spec: FeatureSpec):
        from feast.on_demand_feature_view import OnDemandFeatureView

        from kubeloop.featurestore.store import StoreLocation, feature_view, open_store

        self.spec = spec
        self.store = open_store(StoreLocation.from_json(spec.store))
        self.views: list[ViewInfo] = []
        self.refs: list[str] = []
        types: dict[str, str] = {}
        definitions = [feature_view(self.store, name) for name in spec.views]
        for name, definition in zip(spec.views, definitions, strict=True):
            types.update(_column_types(definition))
            features = tuple(f.name for f in definition.features)
            self.refs += [f"{name}:{f}" for f in features]
            if isinstance(definition, OnDemandFeatureView):
                self.views.append(ViewInfo(name, features))
            else:
                ttl = definition.ttl.total_seconds() if definition.ttl else 0.0
                self.views.append(ViewInfo(name, features, tuple(definition.join_keys), ttl))
        self._stored = [v for v in self.views if v.join_keys]
        self.direct = self._direct(definitions)
        """The lean reader of these views, or None where Feast's get_online_features reads them."""
        self.warmed = self._warm(placeholder_row(spec.inputs, types))
        """Whether a first read was made before any caller's."""

    def _warm(self, row: dict[str, list] | None) -> bool:
        """Read one row of placeholders, so that the store is ready for the
        first caller: Feast's first read of a store imports every online
        store's module to see which can read versioned views (130 ms here,
        against 2 ms a read after it; longer on a cold Pod)."""
        if row is None:
            log.info("no first read of the feature store of %s before callers': no placeholder for the types of "
                     "%s", ", ".join(self.spec.views), ", ".join(self.spec.inputs) or "no columns")
            return False
        try:
            self.read(row)
        except Exception as exc:  # Feast's errors have no common base; the first caller pays instead
            log.warning("the first read of the feature store of %s failed: %s", ", ".join(self.spec.views), exc)
            return False
        return True

    def _direct(self, definitions: list):  # noqa: ANN202 - a DirectReader or None
        from feast.on_demand_feature_view import OnDemandFeatureView

        from kubeloop.featurestore.store import feature_view
        from kubeloop.front.onlineread import DirectReader, uncovered

        sources = {p.name: feature_view(self.store, p.name) for d in definitions
                   if isinstance(d, OnDemandFeatureView) for p in d.source_feature_view_projections.values()}
        reason = uncovered(definitions, sources)
        if reason:
            log.info("the views %s are read through Feast's get_online_features (%s)", ", ".join(self.spec.views),
                     reason)
            return None
        return DirectReader(self.store, definitions, sources)

    def read(self, rows: dict[str, list]) -> Retrieved:
        """The online values of the spec's views for the rows (entity keys and
        request columns), with which entities were found and when their
        values were computed."""
        return self.direct.read(rows) if self.direct else self.read_through_feast(rows)

    def read_through_feast(self, rows: dict[str, list]) -> Retrieved:
        """What read answers, through Feast's get_online_features."""
        from feast.protos.feast.serving.ServingService_pb2 import FieldStatus

        response = self.store.get_online_features(features=self.refs, entity_rows=rows).proto
        names = list(response.metadata.feature_names.val)
        position = {name: k for k, name in enumerate(names)}
        values = {name: [proto_value(v) for v in response.results[k].values] for name, k in position.items()}
        retrieved = Retrieved(values)
        for view in self._stored:
            result = response.results[position[view.features[0]]]
            # sqlite answers an unknown entity NOT_FOUND; Feast's Redis store
            # answers PRESENT with a null value and no event time.
            retrieved.found[view.name] = [s != FieldStatus.NOT_FOUND and t.seconds > 0
                                          for s, t in zip(result.statuses, result.event_timestamps, strict=True)]
            retrieved.timestamps[view.name] = [t.seconds + t.nanos / 1e9 if t.seconds else None
                                               for t in result.event_timestamps]
        return retrieved

    def assemble(self, rows: dict[str, list], now: float, policy: Policy) -> Assembled:
        return assemble(self.spec, self.views, rows, self.read(rows), now, policy)


def assemble_joined(store, requests: Sequence[dict[str, list]], policy: Policy) -> list[Assembled | RequestError]:  # noqa: ANN001
    """What assemble answers each request, from one read of the store (an
    OnlineStore, or anything with its spec, views and read) for all their rows."""
    rows, spans = concat_rows(requests)
    retrieved = store.read(rows)
    return assemble_each(store.spec, store.views, rows, spans, retrieved, time.time(), policy)


def _column_types(definition) -> dict[str, str]:  # noqa: ANN001 - a feast (on-demand) feature view
    """The Feast value type (ValueType name) of each entity key and request
    column a view reads."""
    fields = [*getattr(definition, "entity_columns", ()),
              *(f for source in getattr(definition, "source_request_sources", {}).values() for f in source.schema)]
    return {f.name: f.dtype.to_value_type().name for f in fields}


def proto_value(proto):  # noqa: ANN001, ANN201 - a feast Value proto, or None
    """The Python value a Feast Value holds (None when it holds none)."""
    kind = proto.WhichOneof("val") if proto is not None else None
    return None if kind is None or kind == "null_val" else getattr(proto, kind)
