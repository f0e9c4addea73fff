"""A model's Triton config narrowed to some of its versions (pure): what a
pool loads a model with when others of its versions cannot load, given to
Triton's load as a config override (JSON, field names as in the proto)."""

from __future__ import annotations

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc


def config_without(text: str, failed: set[str]) -> str | None:
    """The config (config.pbtxt's text) serving its specific versions but
    the failed ones, as JSON; None where it names no specific versions
    (nothing to narrow) or none would be left."""
    config = text_format.Parse(text, mc.ModelConfig())
    if config.version_policy.WhichOneof("policy_choice") != "specific":
        return None
    kept = [v for v in config.version_policy.specific.versions if str(v) not in failed]
    if not kept:
        return None
    del config.version_policy.specific.versions[:]
    config.version_policy.specific.versions.extend(kept)
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)
