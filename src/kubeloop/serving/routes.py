"""The router's configuration for a set of served versions (pure): one
builder for the local backend's file and the cluster's ConfigMap, so the
data plane behaves the same in both places (see kubeloop.front.router)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kubeloop.api.signature import ModelSignature
from kubeloop.front.features import FeatureSpec
from kubeloop.registry.tags import FEATURE_STORE
from kubeloop.serving.base import ServedVersion, ServingRequest

PAIRED_BUDGET = 5.0
"""While a canary is served, the percent of all requests the router also
sends to the primary to compare (paired rows for the rollout's analysis).
Each costs the primary's Triton one more call, so the budget holds the
extra load at 5% whatever the canary's share: a 5% step pairs every
canary request, a 50% step one in ten. A small first step is where a bad
challenger must be caught, and there it gets the most pairs."""


def compare_percent(canary_percent: int) -> int:
    """The keyed share of the canary's requests that are paired (pure)."""
    return min(100, round(100 * PAIRED_BUDGET / canary_percent)) if canary_percent > 0 else 0


def build_router_config(request: ServingRequest, triton_model: str, triton_url: str, request_log: str | None,
                        roles: Collection[str] = ("primary", "canary", "shadow"),
                        version_urls: dict[str, str] | None = None, published_stores_only: bool = False) -> dict:
    """Routes (primary and canary by share, shadow mirrored, a share of the
    canary's requests paired with the primary) for the versions
    of the given roles, what the answers mean, where requests are logged, and
    what entity requests read from each version's online store; with
    published_stores_only (a router in a Pod) only stores recorded as a
    published feature_store.yaml, never a repository folder on the
    operator's machine."""
    by_role = {v.role: v for v in request.versions if v.role in roles}
    canary, shadow = by_role.get("canary"), by_role.get("shadow")
    routes = [{"role": "primary", "version": by_role["primary"].model.version,
               "percent": 100 - (canary.percent if canary else 0)}]
    if canary:
        routes.append({"role": "canary", "version": canary.model.version, "percent": canary.percent})
    return {
        "service": f"{request.ref.namespace}/{request.ref.name}", "model": by_role["primary"].model.name,
        "triton_model": triton_model, "triton_url": triton_url, "routes": routes,
        "shadow": {"role": "shadow", "version": shadow.model.version, "percent": shadow.percent} if shadow else None,
        "request_log": request_log, "sample_rate": request.spec.request_logging.sample_rate,
        **signature_fields(ModelSignature.from_tags(by_role["primary"].model.tags)),
        "features": feature_specs(list(by_role.values()), published_stores_only),
        "missing": request.spec.features.missing,
        **({"compare": {"percent": compare_percent(canary.percent)}} if canary else {}),
        **({"version_urls": version_urls} if version_urls else {}),
    }


def signature_fields(signature: ModelSignature) -> dict:
    """What the router reads of the served version's signature to parse,
    count and compare its answers."""
    return {"task": signature.task, "output": signature.output_name, "classes": list(signature.classes),
            "threshold": signature.threshold if signature.threshold is not None else 0.5}


def feature_specs(versions: Sequence[ServedVersion], published_only: bool = False) -> dict[str, dict]:
    """Version -> what its entity requests read from the online store, for
    the versions whose signature names feature views and whose feature store
    was recorded (with published_only, as feature_store.yaml text)."""
    specs = {}
    for served in versions:
        spec = FeatureSpec.of(ModelSignature.from_tags(served.model.tags), served.model.tags.get(FEATURE_STORE, ""))
        if spec is not None and (spec.published or not published_only):
            specs[served.model.version] = spec.to_dict()
    return specs
