"""Entity keys for Feast's online stores, and one round trip for every view
of a signature kept in Feast's sqlite or Redis online store.

Why: a one-row entity request reads three stored views of the fraud example.
Through Feast's `online_read` that is three queries (three Redis pipelines),
each with its entity keys converted to protos again, and on sqlite each
feature row's event time parsed by sqlite's converter: 260 µs of CPU for
one row on sqlite (95 µs a row in reads of 16), most of the router's cost of
an entity request. One query over the views' tables, keys converted once per
distinct key and event times parsed once per entity, read the same rows in
100 µs (55 µs a row in reads of 16). On Redis one pipeline carries every
view's HMGETs, as Feast's own `get_online_features` batches them.

Both read Feast's own layout with Feast's own pieces (table names, Redis
keys and hash fields, entity key serialization, value protos, the
conversion of Redis' answers), and answer in the form of Feast's
`online_read`, so the caller cannot tell them apart;
`tests/components/test_online_read.py` holds each to `get_online_features`.
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Sequence

KEYS_KEPT = 16_384
"""Converted entity keys kept (least recently used dropped; a dropped key is
converted again, nothing else is lost)."""
TIMES_KEPT = 4_096
"""Converted event times kept, as keys are."""


@lru_cache(maxsize=KEYS_KEPT)
def entity_key(names: tuple[str, ...], types: tuple, values: tuple):  # noqa: ANN201 - a feast EntityKey
    """The EntityKey proto of one entity (names: its join keys; types: their
    feast ValueTypes; values: (python type, value) pairs, so that 5 and 5.0
    stay apart). Feast reads these and never changes them."""
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.type_map import python_values_to_proto_values

    protos = [python_values_to_proto_values([value], kind)[0] for kind, (_type, value) in zip(types, values,
                                                                                               strict=True)]
    return EntityKey(join_keys=list(names), entity_values=protos)


@lru_cache(maxsize=KEYS_KEPT)
def serialized_key(names: tuple[str, ...], types: tuple, values: tuple, version: int) -> bytes:
    """The entity's key as Feast's online stores hold it."""
    from feast.infra.key_encoding_utils import serialize_entity_key

    return serialize_entity_key(entity_key(names, types, values), entity_key_serialization_version=version)


def typed(values: tuple) -> tuple:
    """values as the key caches take them."""
    return tuple((type(v), v) for v in values)


def one_trip(store, config, views: Sequence, features: Sequence[Sequence[str]]):  # noqa: ANN001, ANN201
    """The reader of the views (each with its features to read) in one round
    trip to Feast's online store `store`: SqliteViews, RedisViews, or None for
    any other store (read a view at a time through its `online_read`)."""
    from feast.infra.online_stores.sqlite import SqliteOnlineStore

    kind = type(store)
    if kind is SqliteOnlineStore:
        return SqliteViews(config, views)
    # Named, not imported: Feast's Redis module needs the redis client, which only its users install.
    if f"{kind.__module__}.{kind.__qualname__}" == "feast.infra.online_stores.redis.RedisOnlineStore":
        return RedisViews(store, config, views, features)
    return None


class SqliteViews:
    """Reads stored views (feast FeatureViews) from Feast's sqlite online
    store in one query (I/O). Safe to call from any thread, one read at a time."""

    def __init__(self, config, views: Sequence):  # noqa: ANN001 - a feast RepoConfig, FeatureViews
        from feast.infra.online_stores.sqlite import SqliteOnlineStore, _quote_id, _table_id, convert_timestamp
        from feast.protos.feast.types.Value_pb2 import Value

        self.convert, self.value = convert_timestamp, Value
        self.path = SqliteOnlineStore._get_db_path(config)
        versioned = config.registry.enable_online_feature_view_versioning
        self.tables = [_quote_id(_table_id(config.project, v, versioned)) for v in views]
        self.lock = threading.Lock()
        self.connection: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        """Read-only, opened at the first read (the store may be materialised after the router starts)."""
        if self.connection is None:
            uri = f"{Path(self.path).absolute().as_uri()}?mode=ro"  # as_uri escapes what a path may hold
            self.connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
        return self.connection

    def read(self, keys: Sequence[list[bytes]]) -> list[list]:
        """For each view (in order), the serialized keys' answers as Feast's
        `online_read` gives them: (event time, feature -> Value proto), or
        (None, None) for a key the store lacks."""
        parts = [f"SELECT {i}, entity_key, feature_name, value, event_ts FROM {table} "
                 f"WHERE entity_key IN ({','.join('?' * len(keys[i]))})"
                 for i, table in enumerate(self.tables) if keys[i]]
        if not parts:
            return [[] for _ in self.tables]
        with self.lock:
            rows = self._connect().execute(" UNION ALL ".join(parts), [k for ks in keys for k in ks]).fetchall()
        found: list[dict[bytes, list]] = [{} for _ in self.tables]
        parse = self.value.FromString
        for view, key, feature, blob, ts in rows:
            entry = found[view].get(key)
            if entry is None:
                entry = found[view][key] = [None, {}]
            entry[1][feature] = parse(blob)
            entry[0] = ts  # Feast keeps the last row's time
        return [[_answer(by_key.get(k), self.convert) for k in ks] for by_key, ks in zip(found, keys, strict=True)]


def _answer(entry: list | None, convert) -> tuple:  # noqa: ANN001 - feast's sqlite timestamp converter
    """(event time, values) as Feast's sqlite store answers."""
    return (None, None) if entry is None else (_event_time(entry[0], convert), entry[1])


@lru_cache(maxsize=TIMES_KEPT)
def _event_time(stored, convert) -> datetime:  # noqa: ANN001 - a stored event_ts, feast's converter
    """A stored event time as Feast's sqlite store answers it: its
    converter's time, marked UTC when it has no zone. Kept: a view's rows
    share a few event times (a batch job's), and converting each row's
    again was 14 us of a five-row read's 93."""
    ts: datetime = convert(stored)
    return ts.astimezone(timezone.utc) if ts.tzinfo is not None else ts.replace(tzinfo=timezone.utc)


class RedisViews:
    """Reads stored views (feast FeatureViews) from Feast's Redis online
    store in one pipeline (I/O), through the store's own client."""

    def __init__(self, store, config, views: Sequence, features: Sequence[Sequence[str]]):  # noqa: ANN001
        """store: Feast's RedisOnlineStore; features: each view's features to read."""
        from feast.infra.online_stores.redis import _versioned_fv_name

        self.store = store
        self.config = config
        self.project = config.project.encode("utf-8")
        self.views = []
        for view, names in zip(views, features, strict=True):
            fv_name = _versioned_fv_name(view, config)
            fields, hashed = store._generate_hset_keys_for_features(view, list(names), fv_name_override=fv_name)
            self.views.append((fv_name, fields, hashed))

    def read(self, keys: Sequence[list[bytes]]) -> list[list]:
        """For each view (in order), the serialized keys' answers as Feast's
        `online_read` gives them."""
        commands = [(key + self.project, hashed) for (_, _, hashed), ks in zip(self.views, keys, strict=True)
                    for key in ks]
        values = self.store._read_hash_fields(self.config, commands) if commands else []
        out, offset = [], 0
        for (fv_name, fields, _), ks in zip(self.views, keys, strict=True):
            out.append(self.store._convert_redis_values_to_protobuf(values[offset:offset + len(ks)], fv_name, fields))
            offset += len(ks)
        return out
