"""The CRDs generated from the typed models: pinned by golden files, and
checked for what makes them useful (descriptions, CEL, printer columns)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubeloop.api.resources import KINDS, build_crd
from kubeloop.cli.api import render_crd

CRD_DIR = Path(__file__).resolve().parents[2] / "charts" / "kubeloop" / "crds"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_committed_crd_matches_the_models(kind):
    committed = (CRD_DIR / f"{kind.crd_name}.yaml").read_text()
    assert committed == render_crd(kind), "run `make crds` and commit the result"


def _walk(schema: dict, path: str = ""):
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_every_field_is_described_so_kubectl_explain_is_useful(kind):
    schema = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    undocumented = [path for path, node in _walk(schema["properties"]["spec"], "spec")
                    if not path.endswith("[]") and not path.endswith("}") and not node.get("description")]
    undocumented += [path for path, node in _walk(schema["properties"]["status"], "status")
                     if not path.endswith("[]") and not path.endswith("}") and not node.get("description")]
    assert undocumented == []


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_crd_is_structural(kind):
    """No refs, no unions left over; every node has a type or an explicit escape."""
    schema = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "anyOf" not in text and "$defs" not in text
    for path, node in _walk(schema):
        assert ("type" in node or node.get("x-kubernetes-int-or-string")
                or node.get("x-kubernetes-preserve-unknown-fields")), path


def test_names_categories_and_subresources():
    short = set()
    for kind in KINDS:
        spec = build_crd(kind)["spec"]
        assert spec["names"]["categories"] == ["kubeloop"]
        assert spec["versions"][0]["subresources"] == {"status": {}}
        assert [c["name"] for c in spec["versions"][0]["additionalPrinterColumns"]][0] == "Phase"
        short.update(spec["names"]["shortNames"])
    # KServe owns isvc; Kubeflow tfjob/pytorchjob/trainjob/pl/...: ours must not clash.
    assert short.isdisjoint({"isvc", "tj", "pl", "trainjob", "tfjob", "pytorchjob", "om"})
    assert len(short) == len(KINDS)


def test_cel_rules_are_attached_where_the_design_needs_them():
    isvc = yaml.safe_dump(build_crd(KINDS[2]))
    assert "mig.profile" in isvc and "messageExpression" in isvc
    om = build_crd(KINDS[1])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert om["properties"]["accuracyBudget"]["properties"]["maxDrop"]["minimum"] == 0
    assert any("tensorrt-fp16" in r["rule"] for r in om["x-kubernetes-validations"])
