"""The API promises only what exists: every spec field `kubectl explain`
shows (each leaf of the CRDs' spec schemas, as charts/kubeloop/crds holds
them) is read by code outside the API types and named by a test.

A field counts as read where code outside kubeloop.api reaches its model
attribute (`.snake_name`) or its key in a raw object ("camelName"); as
tested where a test function (or a fixture or helper under tests/) sets or
reads it the same ways. A new field that no code reads, or that no test
names, fails here with its path. Unit (no cluster): the files alone."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# The core and each area its symlink in src/kubeloop declares (rglob does not follow links).
CODE = ("src/kubeloop", *sorted(p.name for p in (REPO / "src" / "kubeloop").iterdir() if p.is_symlink()))
CONSTANTS = {
    # Single-valued enums the API server fills in: they say what the server
    # speaks, so that another value is a schema change, not a silent one.
    "InferenceService.spec.runtime.name",
    "InferenceService.spec.runtime.protocol",
}


def leaves(schema: dict, path: tuple[str, ...] = ()):
    if schema.get("properties"):
        for key, sub in schema["properties"].items():
            yield from leaves(sub, (*path, key))
    elif schema.get("type") == "array" and schema.get("items", {}).get("properties"):
        yield from leaves(schema["items"], path)
    elif isinstance(schema.get("additionalProperties"), dict) and schema["additionalProperties"].get("properties"):
        yield from leaves(schema["additionalProperties"], path)
    else:
        yield path


def spec_fields() -> list[str]:
    found = []
    for crd_file in sorted((REPO / "charts" / "kubeloop" / "crds").glob("*.yaml")):
        crd = yaml.safe_load(crd_file.read_text())
        kind = crd["spec"]["names"]["kind"]
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        found += [".".join((kind, "spec", *path)) for path in leaves(spec)]
    return found


def snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()


@lru_cache(maxsize=1)
def readers() -> tuple[set[str], str]:
    """Attribute names code outside the API types reads, and its text (for raw keys)."""
    attributes, texts = set(), []
    for area in CODE:
        for path in (REPO / area).rglob("*.py"):
            if (REPO / "src" / "kubeloop" / "api") in path.parents:
                continue
            text = path.read_text()
            texts.append(text)
            attributes |= {n.attr for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Attribute)}
    return attributes, "\n".join(texts)


@lru_cache(maxsize=1)
def test_sources() -> list[str]:
    """The source of every function under tests/ but the benchmarks."""
    sources = []
    for path in (REPO / "tests").rglob("*.py"):
        if "bench" in path.parts:
            continue
        text = path.read_text()
        tree = ast.parse(text)
        sources += [ast.get_source_segment(text, node) for node in ast.walk(tree)
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        sources += [ast.get_source_segment(text, node) for node in tree.body if isinstance(node, ast.Assign)]
    return sources


def named(source: str, key: str) -> bool:
    return f'"{key}"' in source or re.search(rf"\.{snake(key)}\b|\b{snake(key)}=", source) is not None


FIELDS = spec_fields()


def test_the_walk_finds_the_fields_kubectl_explain_shows():
    assert len(FIELDS) > 150
    assert "InferenceService.spec.gpu.mps.memoryLimitMib" in FIELDS
    assert "TrainingJob.spec.hyperparameters.weightDecay" in FIELDS


@pytest.mark.parametrize("field", [f for f in FIELDS if f not in CONSTANTS])
def test_every_spec_field_is_read(field):
    key = field.rsplit(".", 1)[1]
    attributes, text = readers()
    assert snake(key) in attributes or f'"{key}"' in text, (
        f"{field}: no code outside kubeloop.api reads it; implement it or remove it from the API")


@pytest.mark.parametrize("field", FIELDS)
def test_every_spec_field_is_named_by_a_test(field):
    key = field.rsplit(".", 1)[1]
    assert any(named(source, key) for source in test_sources()), (
        f"{field}: no test sets or reads it; add one that shows what it does")


def test_constants_are_fields():
    assert CONSTANTS <= set(FIELDS)
