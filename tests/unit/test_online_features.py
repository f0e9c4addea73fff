"""Entity requests, pure parts (kubeloop.front.features): parsing the v2
columns a signature names, assembling vectors in training order, and the
missing/stale policy. Plain data, no Feast: backend-independent logic; the
local backend's e2e test proves it against a real online store."""

from __future__ import annotations

import json

import pytest

from kubeloop.api.signature import ModelSignature
from kubeloop.front.features import (FeatureSpec, RequestError, Retrieved, ViewInfo, assemble, assemble_each,
                                     is_entity_request, parse_rows, placeholder_row, tensor_request)

SPEC = FeatureSpec(store='{"path": "/repo"}', views=("card_activity", "merchant_risk", "context"),
                   entities=("card_id", "merchant_id"), request_columns=("amount", "channel"),
                   columns=("fraud_rate_30d", "avg_amount_7d", "log_amount"))
VIEWS = (ViewInfo("card_activity", ("avg_amount_7d",), ("card_id",), ttl_seconds=2 * 86400),
         ViewInfo("merchant_risk", ("fraud_rate_30d",), ("merchant_id",), ttl_seconds=10 * 86400),
         ViewInfo("context", ("log_amount",)))
NOW = 1_800_000_000.0


def columns(n: int = 2) -> dict:
    return {"card_id": [7, 8][:n], "merchant_id": [1, 2][:n], "amount": [10.0, 99.5][:n],
            "channel": ["online", "in_store"][:n]}


def request(rows: dict, shape_extra: tuple = ()) -> dict:
    return {"inputs": [{"name": k, "shape": [len(v), *shape_extra], "datatype": "BYTES" if k == "channel" else "FP64",
                        "data": v} for k, v in rows.items()]}


def retrieved(found_card=(True, True), card_age=(3600.0, 3600.0)) -> Retrieved:
    return Retrieved(values={"avg_amount_7d": [50.0 if f else None for f in found_card], "fraud_rate_30d": [0.1, 0.2],
                             "log_amount": [2.4, float("nan")], "card_id": [7, 8]},
                     found={"card_activity": list(found_card), "merchant_risk": [True, True]},
                     timestamps={"card_activity": [NOW - a if f else None for a, f in zip(card_age, found_card, strict=True)],
                                 "merchant_risk": [NOW - 86400, NOW - 86400]})


def test_a_request_of_columns_is_an_entity_request_and_a_features_tensor_is_not():
    assert is_entity_request(request(columns()))
    assert not is_entity_request({"inputs": [{"name": "features", "shape": [1, 3], "data": [1, 2, 3]}]})
    assert not is_entity_request({"inputs": []}) and not is_entity_request({})


@pytest.mark.parametrize("extra", [(), (1,)])
def test_columns_are_read_flat_or_as_rows_of_one(extra):
    rows = columns()
    payload = request({k: [[v] for v in vs] if extra else vs for k, vs in rows.items()}, extra)
    assert parse_rows(payload, SPEC) == rows


@pytest.mark.parametrize("change, words", [
    (lambda p: p["inputs"].pop(0), "lacks the input card_id"),
    (lambda p: p["inputs"].append({"name": "colour", "shape": [2], "data": [1, 2]}), "unknown input colour"),
    (lambda p: p["inputs"][2].update(data=[1.0], shape=[1]), "same number of rows"),
    (lambda p: p["inputs"][2].update(shape=[1, 2]), "shape [1, 2] does not fit 2 values"),
    (lambda p: p["inputs"][2].update(data="12"), "data must be a list"),
])
def test_a_malformed_entity_request_is_refused_naming_the_input(change, words):
    payload = request(columns())
    change(payload)
    with pytest.raises(RequestError) as caught:
        parse_rows(payload, SPEC)
    assert caught.value.status == 400 and words in str(caught.value)


def test_vectors_follow_the_training_order_and_nan_or_none_is_the_training_default():
    out = assemble(SPEC, VIEWS, columns(), retrieved(), NOW, "default")
    assert out.vectors == [[0.1, 50.0, 2.4], [0.2, 50.0, 0.0]] and out.problems == []


def test_an_unknown_entity_gets_the_training_default_and_is_reported_by_view():
    out = assemble(SPEC, VIEWS, columns(), retrieved(found_card=(True, False)), NOW, "default")
    assert out.vectors[1] == [0.2, 0.0, 0.0]
    assert [(p.view, p.row, p.reason, p.entity) for p in out.problems] == [("card_activity", 1, "missing", "card_id=8")]


def test_a_value_past_its_views_ttl_is_stale_and_blanked_under_default():
    out = assemble(SPEC, VIEWS, columns(), retrieved(card_age=(3600.0, 3 * 86400.0)), NOW, "default")
    assert out.vectors == [[0.1, 50.0, 2.4], [0.2, 0.0, 0.0]]
    assert [(p.view, p.reason) for p in out.problems] == [("card_activity", "stale")]


@pytest.mark.parametrize("data, words", [
    (retrieved(found_card=(True, False)), "card_id=8 is not in the online store (feature view card_activity)"),
    (retrieved(card_age=(3 * 86400.0, 3600.0)), "card_id=7: feature view card_activity holds a value 72.0 h old"),
])
def test_reject_answers_422_naming_the_entity_and_the_view(data, words):
    with pytest.raises(RequestError) as caught:
        assemble(SPEC, VIEWS, columns(), data, NOW, "reject")
    assert caught.value.status == 422 and words in str(caught.value) and "spec.features.missing" in str(caught.value)
    assert [p.view for p in caught.value.problems] == ["card_activity"]


@pytest.mark.parametrize("policy", ["default", "reject"])
def test_each_request_of_a_joined_read_gets_its_own_rows_and_only_its_own_problems(policy):
    """Two one-row requests read as one: the second's card is unknown. Each
    gets what assemble gives its row alone; under reject only the second is
    refused, its problem at its own row 0."""
    data = retrieved(found_card=(True, False))
    first, second = assemble_each(SPEC, VIEWS, columns(), [(0, 1), (1, 2)], data, NOW, policy)
    alone = assemble(SPEC, VIEWS, columns(1), Retrieved(*({k: v[:1] for k, v in t.items()} for t in (
        data.values, data.found, data.timestamps))), NOW, policy)
    assert (first.vectors, first.problems, first.joined) == (alone.vectors, [], 2)
    problems = [("card_activity", 0, "missing", "card_id=8")]
    if policy == "reject":
        assert isinstance(second, RequestError) and second.status == 422 and "card_id=8" in str(second)
        assert [(p.view, p.row, p.reason, p.entity) for p in second.problems] == problems
    else:
        assert second.vectors == [[0.2, 0.0, 0.0]] and second.joined == 2
        assert [(p.view, p.row, p.reason, p.entity) for p in second.problems] == problems


def test_a_feature_the_store_does_not_answer_is_an_error_naming_it():
    data = retrieved()
    del data.values["log_amount"]
    with pytest.raises(RequestError, match="no feature log_amount"):
        assemble(SPEC, VIEWS, columns(), data, NOW, "default")


def test_the_spec_comes_from_the_signature_and_the_store_and_round_trips():
    signature = ModelSignature(feature_columns=list(SPEC.columns), feature_views=list(SPEC.views),
                               entities=list(SPEC.entities), request_columns=list(SPEC.request_columns))
    assert FeatureSpec.of(signature, SPEC.store) == SPEC == FeatureSpec.from_dict(json.loads(json.dumps(SPEC.to_dict())))
    assert FeatureSpec.of(signature, "") is None
    assert FeatureSpec.of(ModelSignature(feature_columns=["x"]), SPEC.store) is None


def test_the_triton_request_is_one_fp32_tensor_of_the_vectors():
    body = tensor_request([[1.0, 2.0], [3.0, 4.0]], request_id="r1")
    assert body == {"id": "r1", "inputs": [{"name": "features", "shape": [2, 2], "datatype": "FP32",
                                           "data": [[1.0, 2.0], [3.0, 4.0]]}]}


def test_the_local_backend_writes_each_versions_features_and_the_policy_the_router_reads(tmp_path):
    """router.json's entity-request part as the local backend writes it from
    the versions' signature and feature-store tags and the spec's policy,
    read back by the router (local backend)."""
    from kubeloop.api.serving import InferenceServiceSpec
    from kubeloop.api.signature import TAG
    from kubeloop.registry.base import ModelVersion
    from kubeloop.registry.tags import FEATURE_STORE
    from kubeloop.serving.base import ServedVersion
    from kubeloop.serving.routes import feature_specs
    from kubeloop.front.router import RouterConfig

    signature = ModelSignature(feature_columns=list(SPEC.columns), feature_views=list(SPEC.views),
                               entities=list(SPEC.entities), request_columns=list(SPEC.request_columns))
    with_store = ModelVersion("m", "3", "runs:/r", tags={TAG: signature.to_json(), FEATURE_STORE: SPEC.store})
    raw_only = ModelVersion("m", "4", "runs:/r", tags={TAG: ModelSignature(feature_columns=["x"]).to_json()})
    spec = InferenceServiceSpec.model_validate({"model": {"name": "m", "alias": "champion"},
                                                "features": {"missing": "reject"}})
    path = tmp_path / "router.json"
    path.write_text(json.dumps({
        "service": "ml/m", "model": "m", "triton_model": "m", "triton_url": "",
        "routes": [{"role": "primary", "version": "3", "percent": 100}],
        "features": feature_specs([ServedVersion("primary", with_store, 100), ServedVersion("canary", raw_only, 0)]),
        "missing": spec.features.missing}))
    config = RouterConfig.load(path)
    assert config.features == {"3": SPEC} and config.missing == "reject"
    assert InferenceServiceSpec.model_validate({"model": {"name": "m", "alias": "a"}}).features.missing == "default"


def test_the_skew_check_compares_served_rows_with_offline_ones_and_counts_what_differs():
    """The pure half of `kubeloop serving skew`: request-log records to served
    rows (entity requests only, no shadow or paired copies), then row-by-row
    comparison within a relative tolerance."""
    from kubeloop.serving.skew import compare, served_rows

    records = [
        {"ts": 10.0, "version": "3", "role": "primary", "request": {"card_id": [7, 8], "amount": [1.0, 2.0]},
         "features": [[1.0, 2.0], [3.0, 4.0]]},
        {"ts": 11.0, "version": "3", "role": "shadow", "request": {"card_id": [9], "amount": [1.0]},
         "features": [[0.0, 0.0]]},
        {"ts": 11.5, "version": "2", "role": "paired", "request": {"card_id": [9], "amount": [1.0]},
         "features": [[0.0, 0.0]]},
        {"ts": 12.0, "version": "3", "role": "primary", "features": [[5.0, 6.0]]},
    ]
    rows = served_rows(records, sample=10)
    assert [(r.columns, r.vector) for r in rows] == [({"card_id": 7, "amount": 1.0}, [1.0, 2.0]),
                                                     ({"card_id": 8, "amount": 2.0}, [3.0, 4.0])]
    same = compare("3", ["a", "b"], rows, [[1.0, 2.0 + 1e-7], [3.0, 4.0]])
    assert same.matches and same.compared == 2
    skewed = compare("3", ["a", "b"], rows, [[1.0, 2.5], None])
    assert not skewed.matches and (skewed.compared, skewed.mismatched, skewed.not_in_offline) == (1, 1, 1)
    assert skewed.by_column == {"b": 1} and "b served 2 offline 2.5" in skewed.examples[0]
    assert not compare("3", ["a", "b"], rows, [None, None]).matches
    assert len(served_rows(records * 50, sample=7)) == 7


def test_a_router_pod_opens_only_published_feature_stores():
    """Cluster path (builder): a store recorded as a repository folder is a
    path on the operator's machine, which a router Pod cannot open (it would
    never turn ready: seen on the real node), so its routes name none; a
    store recorded as feature_store.yaml text (published, as Feast's
    operator gives clients) is one a Pod can open, and its routes name it."""
    from kubeloop.api.serving import InferenceServiceSpec
    from kubeloop.api.signature import TAG
    from kubeloop.gpu.placement import CPU
    from kubeloop.registry.base import ModelVersion
    from kubeloop.registry.tags import FEATURE_STORE
    from kubeloop.serving.base import ServedVersion, ServingRequest
    from kubeloop.serving.cluster import cluster_router_config
    from kubeloop.serving.routes import build_router_config
    from tests.unit.test_builders_serving import REF

    signature = ModelSignature(feature_columns=list(SPEC.columns), feature_views=list(SPEC.views),
                               entities=list(SPEC.entities), request_columns=list(SPEC.request_columns))
    version = ModelVersion("m", "3", "runs:/r", tags={TAG: signature.to_json(), FEATURE_STORE: SPEC.store})
    spec = InferenceServiceSpec.model_validate({"model": {"name": "m", "alias": "champion"}})
    request = ServingRequest(REF, spec, (ServedVersion("primary", version, 100),), CPU)
    local = build_router_config(request, "m", "http://127.0.0.1:8000", None)
    assert local["features"] == {"3": SPEC.to_dict()}
    pod = cluster_router_config(request, {"primary": (version, 100)}, None, {"3": "http://m-primary"})
    assert pod["features"] == {} and pod["version_urls"] == {"3": "http://m-primary"}
    published = json.dumps({"config": "project: fraud\nregistry: s3://feast/fraud/registry.db\n"})
    version = ModelVersion("m", "3", "runs:/r", tags={TAG: signature.to_json(), FEATURE_STORE: published})
    request = ServingRequest(REF, spec, (ServedVersion("primary", version, 100),), CPU)
    pod = cluster_router_config(request, {"primary": (version, 100)}, None, {"3": "http://m-primary"})
    assert pod["features"]["3"]["store"] == published


def test_a_placeholder_row_has_each_column_a_value_of_its_feast_type():
    row = placeholder_row(["card_id", "amount", "channel", "weekend"],
                          {"card_id": "INT64", "amount": "DOUBLE", "channel": "STRING", "weekend": "BOOL"})
    assert row == {"card_id": [0], "amount": [0.0], "channel": [""], "weekend": [False]}
    assert type(row["card_id"][0]) is int and type(row["amount"][0]) is float


@pytest.mark.parametrize("columns, types", [
    ([], {}),
    (["card_id", "seen"], {"card_id": "INT64", "seen": "UNIX_TIMESTAMP"}),
    (["card_id", "amount"], {"card_id": "INT64"}),
], ids=["no columns", "a type without a placeholder", "a column of no view"])
def test_no_placeholder_row_when_a_column_has_none(columns, types):
    assert placeholder_row(columns, types) is None
