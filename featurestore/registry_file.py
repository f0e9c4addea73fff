"""A file registry that readers never see half-written.

Feast's file registry store rewrites its file in place: a reader opening it
mid-write (a training step while the operator's schedule records a
materialisation) parses an empty registry and finds no feature views. This
store writes a sibling file and renames it over the registry, so a reader
sees the registry before the write or after it."""

from __future__ import annotations

import os
import tempfile
import uuid
from datetime import datetime, timezone

from feast.infra.registry.file import FileRegistryStore

CLASS_PATH = f"{__name__}.AtomicFileRegistryStore"


class AtomicFileRegistryStore(FileRegistryStore):
    """Feast's file registry store, each write replacing the file whole."""

    def _write_registry(self, registry_proto) -> None:  # noqa: ANN001 - feast's RegistryProto
        registry_proto.version_id = str(uuid.uuid4())
        registry_proto.last_updated.FromDatetime(datetime.now(timezone.utc))
        target = self._filepath
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as tmp:
            tmp.write(registry_proto.SerializeToString())
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, target)


def uses_file_store(registry) -> bool:  # noqa: ANN001 - feast's RegistryConfig
    """Whether a registry config leaves its store to Feast's file default: a
    file registry on a local path, no store type named."""
    path = str(registry.path or "")
    return (registry.registry_type == "file" and not registry.registry_store_type
            and ("://" not in path or path.startswith("file://")))
