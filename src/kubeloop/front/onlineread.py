"""A served version's online features read through Feast's lower layer: the
online store's own `online_read` for each stored view and each on-demand
view's own function over the inputs its `transform_dict` would build, which
is what Feast's `get_online_features` runs too, without its generic request
handling.

Why: on the router, Feast's `get_online_features` was the entity path's
bound (60% of the router's CPU at 16 callers, a six-row read of the fraud
views costing 2.4 ms, of which the online store's reads were a third).

Where Feast keeps the views in its sqlite or Redis online store, every view
is read in one round trip (one query over Feast's tables, one Redis
pipeline: kubeloop.front.storeread); any other store through its
`online_read`, a view at a time. Either way each distinct
entity's key is converted once, and converted keys are kept for the next
reads.

It covers what a served signature commonly names: feature views read by
their own join keys, and python-mode on-demand views over them and request
columns. Anything else (aliases, versioned views, aggregations, pandas
mode, singleton or stored on-demand views) goes through
`get_online_features`, which `covered` says, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kubeloop.front.features import Retrieved, proto_value
from kubeloop.front.storeread import entity_key, one_trip, serialized_key, typed


@dataclass(frozen=True)
class _Stored:
    definition: object
    """The feast FeatureView."""
    features: tuple[str, ...]
    names: tuple[str, ...]
    """Its join keys."""
    types: tuple
    """Their feast ValueTypes, as Feast converts the caller's keys."""


def uncovered(definitions: Sequence, sources: dict) -> str | None:  # noqa: ANN001 - feast views
    """Why the views (a signature's, and `sources`: name -> the feature
    view each on-demand view reads) need Feast's `get_online_features`, or
    None when this module reads them alike."""
    from feast.on_demand_feature_view import OnDemandFeatureView

    for definition in [*definitions, *sources.values()]:
        if isinstance(definition, OnDemandFeatureView):
            reason = _odfv_uncovered(definition, sources)
        else:
            reason = _view_uncovered(definition)
        if reason:
            return f"{definition.name}: {reason}"
    return None


def _view_uncovered(view) -> str | None:  # noqa: ANN001 - a feast FeatureView
    from feast.on_demand_feature_view import OnDemandFeatureView

    projection = view.projection
    if isinstance(view, OnDemandFeatureView):
        return "an on-demand view reads another on-demand view"
    if projection.name_alias or projection.join_key_map:
        return "aliased projection"
    if getattr(projection, "version_tag", None) is not None:
        return "versioned read"
    if not view.join_keys:
        return "no entity (Feast reads it by a dummy key)"
    return None


def _odfv_uncovered(view, sources: dict) -> str | None:  # noqa: ANN001 - a feast OnDemandFeatureView
    if view.mode != "python" or view.singleton:
        return f"mode {view.mode}{' singleton' if view.singleton else ''} (python batch mode is read directly)"
    if view.write_to_online_store:
        return "its values are stored online"
    if getattr(view, "aggregations", None) or view.feature_transformation is None:
        return "aggregations"
    missing = [p.name for p in view.source_feature_view_projections.values() if p.name not in sources]
    return f"source views {', '.join(missing)} not found" if missing else None


class DirectReader:
    """Reads the views of an opened Feast store (I/O). `views`: the
    signature's feast view definitions in its order; `sources`: every
    feature view its on-demand views read (uncovered(...) must be None)."""

    def __init__(self, store, views: Sequence, sources: dict):  # noqa: ANN001 - feast objects
        from feast.infra.provider import get_provider
        from feast.on_demand_feature_view import OnDemandFeatureView

        self.config = store.config
        self.version = store.config.entity_key_serialization_version
        self.provider = get_provider(store.config)
        self.signature = {v.name for v in views if not isinstance(v, OnDemandFeatureView)}
        self.requested = {v.name: tuple(f.name for f in v.features) for v in views}
        self.on_demand = [v for v in views if isinstance(v, OnDemandFeatureView)]
        self.inputs = {v.name: transform_names(v) for v in self.on_demand}
        stored = {v.name: v for v in views if v.name in self.signature} | sources
        self.stored = [_Stored(v, _read_features(v, self.requested, self.on_demand), *_key_types(v))
                       for v in stored.values()]
        self.batched = one_trip(self.provider.online_store, self.config, [t.definition for t in self.stored],
                                [t.features for t in self.stored])
        """Every view in one round trip, where Feast keeps them in its sqlite or Redis store."""

    def read(self, rows: dict[str, list]) -> Retrieved:
        """The values of the signature's features for the rows (entity keys
        and request columns), as OnlineStore.read answers them."""
        read: dict[str, dict[str, list]] = {}
        retrieved = Retrieved({})
        for table, answers in zip(self.stored, self._read_views(rows), strict=True):
            name = table.definition.name
            read[name] = {f: [proto_value(data.get(f)) if data else None for _ts, data in answers]
                          for f in table.features}
            if name in self.signature:
                seconds = [ts.timestamp() if ts is not None else None for ts, _data in answers]
                # Feast's Redis store answers an unknown entity with empty
                # values at time 0, sqlite with nothing.
                retrieved.found[name] = [s is not None and s > 0 and data is not None
                                         for s, (_ts, data) in zip(seconds, answers, strict=True)]
                retrieved.timestamps[name] = [s if s else None for s in seconds]
                retrieved.values.update({f: read[name][f] for f in self.requested[name]})
        for view in self.on_demand:
            out = view.feature_transformation.transform(transform_inputs(self.inputs[view.name], rows, read))
            retrieved.values.update({f: list(out[f]) for f in self.requested[view.name]})
        return retrieved

    def _read_views(self, rows: dict[str, list]) -> list[list]:
        """Each stored view's answer for each row, as Feast's `online_read`
        gives it; each distinct entity read once."""
        rowkeys, unique = [], []
        for table in self.stored:
            keys = [typed(k) for k in zip(*(rows[k] for k in table.names), strict=True)]
            rowkeys.append(keys)
            unique.append(list(dict.fromkeys(keys)))
        if self.batched is not None:
            answers = self.batched.read([[serialized_key(t.names, t.types, k, self.version) for k in keys]
                                        for t, keys in zip(self.stored, unique, strict=True)])
        else:
            answers = [self.provider.online_read(config=self.config, table=t.definition,
                                                 entity_keys=[entity_key(t.names, t.types, k) for k in keys],
                                                 requested_features=list(t.features))
                       for t, keys in zip(self.stored, unique, strict=True)]
        out = []
        for keys, distinct, answered in zip(rowkeys, unique, answers, strict=True):
            at = dict(zip(distinct, answered, strict=True))
            out.append([at[k] for k in keys])
        return out


def _read_features(view, requested: dict, on_demand: Sequence) -> tuple[str, ...]:  # noqa: ANN001
    """A stored view's features to read: those the signature names, and
    those its on-demand views take from it."""
    names = list(requested.get(view.name, ()))
    for odfv in on_demand:
        for projection in odfv.source_feature_view_projections.values():
            if projection.name == view.name:
                names += [f.name for f in projection.features]
    return tuple(dict.fromkeys(names))


def transform_inputs(names: list[tuple[str, str, str]], rows: dict[str, list],
                     read: dict[str, dict[str, list]]) -> dict:
    """What `transform_dict` hands an on-demand view's function (names: its
    transform_names): the request columns and each source feature under its
    own name and its `view__feature` name. Not through `transform_dict`
    itself: Feast's OnDemandFeatureView is @typechecked, and typeguard's
    checks of its arguments were 30% of a one-row read's CPU."""
    inputs = dict(rows)
    for source, feature, full in names:
        inputs[feature] = inputs[full] = read[source][feature]
    return inputs


def transform_names(view) -> list[tuple[str, str, str]]:  # noqa: ANN001 - a feast OnDemandFeatureView
    """(source view, feature, `view__feature`) for each feature the view's function reads."""
    return [(p.name, f.name, f"{p.name}__{f.name}") for p in view.source_feature_view_projections.values()
            for f in p.features]


def _key_types(view) -> tuple[tuple[str, ...], tuple]:  # noqa: ANN001 - a feast FeatureView
    columns = view.entity_columns
    return tuple(f.name for f in columns), tuple(f.dtype.to_value_type() for f in columns)
