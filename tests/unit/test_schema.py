"""pydantic JSON schema -> structural CRD schema."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from kubeloop.api.base import KubeModel
from kubeloop.api.schema import cel, model_schema, structural


class Inner(KubeModel):
    """An inner object."""

    size: int = Field(default=3, gt=0, le=10)
    """How big."""


class Outer(KubeModel):
    """The outer object."""

    model_config = ConfigDict(json_schema_extra=cel(("self.a != 'x'", "a must not be x", "a")))

    a: str
    """First line
    and a second line."""
    inner: Inner = Field(default_factory=Inner)
    """The inner part."""
    maybe: Inner | None = None
    """Optional inner."""
    mode: Literal["one", "two"] = "one"
    """A choice."""
    quantity: int | str = "1"
    """A quantity."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Free tags."""


def test_refs_are_inlined_and_field_descriptions_win():
    schema = model_schema(Outer)
    inner = schema["properties"]["inner"]
    assert inner["type"] == "object"
    assert inner["description"] == "The inner part."
    assert inner["properties"]["size"]["description"] == "How big."
    assert schema["properties"]["maybe"]["properties"]["size"]["default"] == 3


def test_nested_objects_default_to_empty_so_the_api_server_fills_their_defaults():
    schema = model_schema(Outer)
    assert schema["properties"]["inner"]["default"] == {}
    assert "default" not in schema["properties"]["maybe"]


def test_openapi_v3_0_bounds_enums_quantities_and_maps():
    schema = model_schema(Outer)
    size = schema["properties"]["inner"]["properties"]["size"]
    assert size["minimum"] == 0 and size["exclusiveMinimum"] is True and size["maximum"] == 10
    assert schema["properties"]["mode"] == {"type": "string", "enum": ["one", "two"], "default": "one",
                                            "description": "A choice."}
    assert schema["properties"]["quantity"]["x-kubernetes-int-or-string"] is True
    assert schema["properties"]["tags"]["additionalProperties"] == {"type": "string"}


def test_descriptions_are_one_line_and_cel_rules_carry_field_paths():
    schema = model_schema(Outer)
    assert schema["properties"]["a"]["description"] == "First line and a second line."
    assert schema["x-kubernetes-validations"] == [
        {"rule": "self.a != 'x'", "message": "a must not be x", "fieldPath": ".a"}]
    assert schema["required"] == ["a"]


def test_a_real_union_is_refused():
    class Bad(BaseModel):
        x: int | bool

    with pytest.raises(ValueError, match="no structural form"):
        structural(Bad.model_json_schema())


def test_recursive_models_are_refused():
    class Node(BaseModel):
        child: "Node | None" = None

    with pytest.raises(ValueError, match="recursive"):
        structural(Node.model_json_schema())
