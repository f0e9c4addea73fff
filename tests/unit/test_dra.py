"""GPU placement as DRA asks for it, and the fleet as NVIDIA's DRA driver
publishes it (unit: plain data; the real scheduler allocating the claims is
proven in tests/e2e/test_serving_placement.py)."""

from __future__ import annotations

import re

from kubeloop.api.serving import ServingGPU
from kubeloop.dev.fleet import build_resource_slices, load_fleet
from kubeloop.gpu.dra import MIG_CLASS, device_request
from kubeloop.gpu.placement import CPU, plan
from kubeloop.operator.builders.serving import ServingImages, build_children
from tests.unit.test_builders_serving import REF, V1, spec
from tests.unit.test_placement import GiB, fleet


def test_a_mig_decision_becomes_a_request_for_that_profile_of_that_product_with_the_memory():
    decision = plan(ServingGPU(sharing="mig"), 8 * GiB, fleet())
    request = device_request(decision)
    assert request["exactly"]["deviceClassName"] == MIG_CLASS and request["exactly"]["count"] == 1
    cel = request["exactly"]["selectors"][0]["cel"]["expression"]
    assert "productName == 'NVIDIA-H100-80GB-HBM3'" in cel and "profile == '1g.10gb'" in cel
    assert "compareTo(quantity('8192Mi')) >= 0" in cel


def test_whole_gpus_are_counted_and_mps_and_cpu_stay_with_the_device_plugin():
    whole = device_request(plan(ServingGPU(sharing="exclusive", count=2), 30 * GiB, fleet()))
    assert whole["exactly"]["deviceClassName"] == "gpu.nvidia.com" and whole["exactly"]["count"] == 2
    assert device_request(plan(ServingGPU(sharing="mps"), 4 * GiB, fleet())) is None
    assert device_request(CPU) is None


def test_with_dra_the_pod_claims_its_slice_from_a_template_instead_of_an_extended_resource():
    decision = plan(ServingGPU(sharing="mig"), 8 * GiB, fleet())
    children = build_children(REF, spec(), {"primary": (V1, 100)}, decision, ServingImages(gpu_allocation="dra"))
    template = next(c for c in children if c["kind"] == "ResourceClaimTemplate")
    assert template["spec"]["spec"]["devices"]["requests"] == [device_request(decision)]
    pod = next(c for c in children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}]
    triton = pod["containers"][0]
    assert triton["resources"]["claims"] == [{"name": "gpu"}]
    assert not any(k.startswith("nvidia.com/") for k in triton["resources"]["limits"])
    plugin = build_children(REF, spec(), {"primary": (V1, 100)}, decision, ServingImages())
    assert not [c for c in plugin if c["kind"] == "ResourceClaimTemplate"]
    assert plugin[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"


def test_the_fleet_publishes_its_mig_devices_and_whole_gpus_but_not_mps_shares():
    slices = {s["spec"]["nodeName"]: s for s in build_resource_slices(load_fleet().nodes)}
    assert sorted(slices) == ["gpu-a100-mig-single", "gpu-h100-mig-mixed", "gpu-l40s"]
    h100 = slices["gpu-h100-mig-mixed"]["spec"]["devices"]
    assert len(h100) == 8 * 4  # all-balanced: 2x 1g.10gb, 2g.20gb, 3g.40gb per GPU
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["name"]) for d in h100)
    big = next(d for d in h100 if d["attributes"]["profile"]["string"] == "3g.40gb")
    assert big["attributes"]["type"] == {"string": "mig"} and big["capacity"]["memory"] == {"value": "40320Mi"}
    assert big["attributes"]["architecture"] == {"string": "hopper"}
    assert big["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert {d["attributes"]["type"]["string"] for d in slices["gpu-l40s"]["spec"]["devices"]} == {"gpu"}
