"""Turn pydantic JSON schemas into Kubernetes structural OpenAPI v3 schemas.

pydantic writes JSON Schema 2020-12: $refs into $defs, anyOf with null for
optional fields, numeric exclusive bounds, titles. A CRD wants a structural
schema: everything inlined, no nulls, OpenAPI v3.0 boolean exclusive bounds,
and Kubernetes extensions (CEL rules, int-or-string, preserved unknown fields).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault

# Keywords a structural schema may carry; anything else pydantic emits
# (title, examples, $schema, discriminator, ...) is dropped.
_ALLOWED = {
    "type", "format", "description", "properties", "required", "items",
    "additionalProperties", "enum", "default", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern",
    "minItems", "maxItems", "uniqueItems", "multipleOf", "minProperties",
    "maxProperties", "nullable",
}


def cel(*rules: tuple[str, ...]) -> dict[str, Any]:
    """CEL validation rules for a model or field, as `json_schema_extra`.

    Each rule is (expression, message[, field[, message expression]]): the
    field, relative to the object the rule sits on, is where the API server
    reports the error, so the message can name what to fix; a message
    expression (CEL) can quote the offending value.
    """
    validations = []
    for rule in rules:
        entry = {"rule": rule[0], "message": rule[1]}
        if len(rule) > 2 and rule[2]:
            entry["fieldPath"] = "." + rule[2]
        if len(rule) > 3:
            entry["messageExpression"] = rule[3]
        validations.append(entry)
    return {"x-kubernetes-validations": validations}


class _WireSchema(GenerateJsonSchema):
    """pydantic's generator, but defaults made by a factory appear too.

    A nested object defaults to {} rather than to its expanded value: the API
    server then applies the nested fields' own defaults, the documented way to
    default a whole subtree of a CRD.
    """

    def get_default_value(self, schema):  # noqa: ANN001 - pydantic's core schema
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().get_default_value(schema)
        value = factory()
        return {} if isinstance(value, BaseModel) else value if value is not None else NoDefault


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI schema of a model, as a CRD embeds it (pure)."""
    return structural(model.model_json_schema(by_alias=True, schema_generator=_WireSchema))


def cel_list(values) -> str:
    """A CEL list literal of strings."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """The structural form of a pydantic model's JSON schema (pure)."""
    defs = schema.get("$defs", {})
    return _convert(schema, defs, ())


def _convert(node: dict[str, Any], defs: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
    node = _inline(node, defs)
    if "anyOf" in node:
        node = _collapse_any_of(node, defs)
    ref_stack = stack
    if "__ref__" in node:
        name = node.pop("__ref__")
        if name in stack:
            raise ValueError(f"recursive schema through {name} cannot be inlined into a CRD")
        ref_stack = stack + (name,)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-"):
            out[key] = copy.deepcopy(value)
        elif key == "properties":
            out[key] = {name: _convert(sub, defs, ref_stack) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, ref_stack)
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:
                out[key] = _convert(value, defs, ref_stack)
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default" and value is None:
            continue
        elif key == "description":
            # Docstrings wrap at 100 columns; kubectl explain wraps on its own.
            out[key] = " ".join(value.split())
        elif key in _ALLOWED:
            out[key] = copy.deepcopy(value)
    if "enum" in out and "type" not in out:
        out["type"] = _json_type(out["enum"][0])
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        if "properties" in out:
            out["type"] = "object"
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _inline(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Replace a $ref (or pydantic's allOf-wrapped $ref) by its target; keys
    beside the ref, such as a field's description, win over the target's."""
    node = dict(node)
    if "allOf" in node and len(node["allOf"]) == 1:
        node.update(node.pop("allOf")[0])
    if "$ref" not in node:
        return node
    name = node.pop("$ref").rsplit("/", 1)[-1]
    merged = dict(defs[name])
    merged.update(node)
    merged["__ref__"] = name
    return merged


def _collapse_any_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
    types = sorted(o.get("type", "") for o in options)
    if types == ["integer", "string"]:
        node["x-kubernetes-int-or-string"] = True
        return node
    if len(options) != 1:
        raise ValueError(f"a union of {types} has no structural form; use one type")
    inner = _inline(options[0], defs)
    inner.update({k: v for k, v in node.items() if k != "default" or v is not None})
    return inner


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"
