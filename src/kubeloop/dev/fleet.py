"""The fake GPU fleet: a file of node descriptions turned into Node objects
labelled the way NVIDIA's device plugin and GPU Feature Discovery label real
ones (pure; kubeloop.dev.platform applies them)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kubeloop.gpu.catalog import GpuModel, gpu_model
from kubeloop.gpu.dra import DRIVER, device_entry, partitionable_slices
from kubeloop.gpu.mig import fits_on_one_gpu

DEFAULT_FLEET = Path(__file__).with_name("fleet.yaml")
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MigLayout(_Model):
    strategy: Literal["single", "mixed"]
    config: str
    """The mig-parted configuration name (nvidia.com/mig.config)."""
    devices: dict[str, int]
    """MIG devices per GPU, by profile."""


class Sharing(_Model):
    strategy: Literal["mps", "time-slicing"]
    replicas: int = Field(ge=2)


class GpuSpec(_Model):
    product: str
    count: int = Field(ge=1)
    mig: MigLayout | None = None
    sharing: Sharing | None = None
    partitionable: bool = False
    """MIG cut on demand through DRA: NVIDIA's DRA driver manages the node
    (partitionable devices, no device plugin and no fixed layout)."""

    @model_validator(mode="after")
    def _consistent(self) -> "GpuSpec":
        model = gpu_model(self.product)
        if model is None:
            raise ValueError(f"unknown GPU product {self.product}")
        if self.mig and self.sharing:
            raise ValueError("MPS and time-slicing cannot be layered on MIG")
        if self.partitionable and (self.mig or self.sharing or not model.mig_profiles):
            raise ValueError("a partitionable GPU is a MIG-capable one without a fixed MIG layout or sharing")
        if self.mig:
            if not model.mig_profiles:
                raise ValueError(f"{self.product} has no MIG support")
            if self.mig.strategy == "single" and len(self.mig.devices) != 1:
                raise ValueError("MIG single strategy needs exactly one profile per GPU")
            unknown = [p for p in self.mig.devices if model.profile(p) is None]
            if unknown:
                raise ValueError(f"{self.product} has no MIG profile {', '.join(unknown)}")
            layout = [model.profile(p) for p, n in self.mig.devices.items() for _ in range(n)]
            if not fits_on_one_gpu(model, layout):
                raise ValueError(f"MIG devices {self.mig.devices} do not fit on one {self.product}")
        return self


class NodeSpec(_Model):
    name: str
    cpu: int = 16
    memory: str = "64Gi"
    pods: int = 110
    gpu: GpuSpec | None = None


class Fleet(_Model):
    driver: str
    cuda: str
    nodes: list[NodeSpec]


def load_fleet(path: Path = DEFAULT_FLEET) -> Fleet:
    return Fleet.model_validate(yaml.safe_load(Path(path).read_text()))


def build_nodes(fleet: Fleet) -> list[dict]:
    """Node objects, status included, for every entry of the fleet."""
    return [build_node(node, fleet) for node in fleet.nodes]


def build_node(node: NodeSpec, fleet: Fleet) -> dict:
    capacity = {"cpu": str(node.cpu), "memory": node.memory, "pods": str(node.pods),
                "ephemeral-storage": "500Gi"}
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "kwok-" + (node.gpu.product.lower() if node.gpu else "cpu"),
        "type": "kwok",
    }
    taints = []
    if node.gpu:
        model = gpu_model(node.gpu.product)
        gpu_labels, gpu_capacity = _gpu_labels_and_capacity(node.gpu, model, fleet)
        labels.update(gpu_labels)
        capacity.update(gpu_capacity)
        taints.append(GPU_TAINT)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1],
                            "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": "fake", "containerRuntimeVersion": "kwok"},
            "phase": "Running",
        },
    }


def _gpu_labels_and_capacity(gpu: GpuSpec, model: GpuModel, fleet: Fleet) -> tuple[dict, dict]:
    driver = fleet.driver.split(".")
    cuda = fleet.cuda.split(".")
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.family": model.family,
        "nvidia.com/gpu.compute.major": str(model.compute_capability[0]),
        "nvidia.com/gpu.compute.minor": str(model.compute_capability[1]),
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mig.capable": str(bool(model.mig_profiles)).lower(),
        "nvidia.com/mps.capable": "true",
        "nvidia.com/cuda.driver-version.major": driver[0],
        "nvidia.com/cuda.driver-version.minor": driver[1],
        "nvidia.com/cuda.driver-version.revision": driver[2],
        "nvidia.com/cuda.driver-version.full": fleet.driver,
        "nvidia.com/cuda.runtime-version.major": cuda[0],
        "nvidia.com/cuda.runtime-version.minor": cuda[1],
        "nvidia.com/cuda.runtime-version.full": fleet.cuda,
    }
    capacity: dict[str, str] = {}
    if gpu.partitionable:  # the DRA driver publishes it; the device plugin advertises nothing
        labels.update({"nvidia.com/gpu.deploy.device-plugin": "false", "nvidia.com/gpu.product": model.product,
                       "nvidia.com/gpu.count": str(gpu.count), "nvidia.com/gpu.memory": str(model.memory_mib)})
        return labels, capacity
    if gpu.mig is None:
        replicas = gpu.sharing.replicas if gpu.sharing else 1
        shared = replicas > 1
        labels.update({
            "nvidia.com/gpu.product": model.product + ("-SHARED" if shared else ""),
            "nvidia.com/gpu.count": str(gpu.count),
            "nvidia.com/gpu.memory": str(model.memory_mib),
            "nvidia.com/gpu.replicas": str(replicas),
            "nvidia.com/gpu.sharing-strategy": gpu.sharing.strategy if shared else "none",
        })
        capacity["nvidia.com/gpu"] = str(gpu.count * replicas)
        return labels, capacity
    labels.update({
        "nvidia.com/mig.strategy": gpu.mig.strategy,
        "nvidia.com/mig.config": gpu.mig.config,
        "nvidia.com/mig.config.state": "success",
    })
    if gpu.mig.strategy == "single":
        (name, per_gpu), = gpu.mig.devices.items()
        profile = model.profile(name)
        labels.update({
            "nvidia.com/gpu.product": f"{model.product}-MIG-{name}",
            "nvidia.com/gpu.count": str(gpu.count * per_gpu),
            "nvidia.com/gpu.memory": str(profile.memory_mib),
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/gpu.slices.gi": str(profile.compute_slices),
            "nvidia.com/gpu.slices.ci": str(profile.compute_slices),
        })
        capacity["nvidia.com/gpu"] = str(gpu.count * per_gpu)
        return labels, capacity
    # Mixed: the parent GPUs are no longer allocatable; each profile is.
    labels.update({
        "nvidia.com/gpu.product": model.product,
        "nvidia.com/gpu.count": str(gpu.count),
        "nvidia.com/gpu.memory": str(model.memory_mib),
        "nvidia.com/gpu.replicas": "0",
    })
    capacity["nvidia.com/gpu"] = "0"
    for name, per_gpu in gpu.mig.devices.items():
        profile = model.profile(name)
        prefix = f"nvidia.com/mig-{name}"
        labels.update({
            f"{prefix}.count": str(gpu.count * per_gpu),
            f"{prefix}.memory": str(profile.memory_mib),
            f"{prefix}.product": f"{model.product}-MIG-{name}",
            f"{prefix}.replicas": "1",
            f"{prefix}.sharing-strategy": "none",
            f"{prefix}.slices.gi": str(profile.compute_slices),
            f"{prefix}.slices.ci": str(profile.compute_slices),
        })
        capacity[profile.resource] = str(gpu.count * per_gpu)
    return labels, capacity


def build_resource_slices(nodes: list[NodeSpec]) -> list[dict]:
    """What NVIDIA's DRA driver would publish for the fleet (pure): one
    ResourceSlice per node with a GPU, listing its whole GPUs (type gpu) or,
    on MIG nodes, the MIG devices of the current layout (type mig), with
    product, profile, index and memory. MPS-shared nodes stay with the device
    plugin; partitionable GPUs are published as counter sets and every
    profile placement (kubeloop.gpu.dra.partitionable_slices). The fake
    fleet advertises its other GPUs both ways at once, so either path can
    place on them; a real node is managed by one or the other."""
    slices = []
    for node in nodes:
        gpu = node.gpu
        if gpu is None or gpu.sharing:
            continue
        model = gpu_model(gpu.product)
        if gpu.partitionable:
            slices += partitionable_slices(node.name, model, gpu.count)
            continue
        devices = []
        for index in range(gpu.count):
            if gpu.mig is None:
                devices.append(device_entry(f"gpu-{index}", "gpu", model, index, model.memory_mib))
                continue
            for name, count in sorted(gpu.mig.devices.items()):
                for n in range(count):
                    device = device_entry(f"gpu-{index}-mig-{name.replace('.', '-')}-{n}", "mig", model, index,
                                     model.profile(name).memory_mib)
                    device["attributes"]["profile"] = {"string": name}
                    devices.append(device)
        slices.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node.name}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node.name,
                     "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
        })
    return slices
