"""The fake fleet's MIG manager: what NVIDIA's mig-manager does on a real
node, for KWOK's MIG nodes. When a node's `nvidia.com/mig.config` label
names a layout other than the one it advertises, it re-partitions the GPUs:
with no Pod holding a GPU resource there, the node's GFD labels and MIG
resources (and its ResourceSlice, as DRA publishes the devices) are
rewritten for the new layout and `nvidia.com/mig.config.state` becomes
`success`; with Pods still holding them nothing changes and the
state is `failed` (the node must be drained first, as on a real one).
Layouts are mig-parted's standard configurations for the product (and, under
the single strategy, only the homogeneous all-<profile> ones).

    python -m kubeloop.dev.migmanager --kubeconfig PATH --fleet FLEET_YAML
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from kubeloop.dev.fleet import Fleet, MigLayout, NodeSpec, build_node, build_resource_slices, load_fleet
from kubeloop.gpu.catalog import gpu_model
from kubeloop.gpu.mig import standard_configs

log = logging.getLogger("kubeloop.dev.migmanager")
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
APPLIED = "kubeloop.dev/mig-config-applied"
"""The layout the node advertises now (the fleet file's until a relabel)."""


class RelayoutError(ValueError):
    """The named layout cannot be applied to the node."""


def relaid_spec(spec: NodeSpec, config: str) -> NodeSpec:
    """The node's description under the named layout (pure)."""
    model = gpu_model(spec.gpu.product)
    layouts = standard_configs(model)
    if config not in layouts:
        raise RelayoutError(f"{config} is not a mig-parted layout of {model.product} (known: {sorted(layouts)})")
    devices = layouts[config]
    if spec.gpu.mig.strategy == "single" and len(devices) != 1:
        raise RelayoutError(f"{config} mixes profiles; the single strategy slices every GPU one way")
    mig = MigLayout(strategy=spec.gpu.mig.strategy, config=config, devices=devices)
    return spec.model_copy(update={"gpu": spec.gpu.model_copy(update={"mig": mig})})


def relaid(spec: NodeSpec, fleet: Fleet, config: str) -> dict:
    """The node as it advertises itself under the named layout (pure)."""
    return build_node(relaid_spec(spec, config), fleet)


def node_patches(live: dict, wanted: dict, config: str) -> tuple[dict, dict]:
    """Merge patches of the node's metadata and status that turn live into
    wanted: GPU labels and resources replaced (old MIG resources removed)."""
    labels = {k: v for k, v in wanted["metadata"]["labels"].items() if k.startswith("nvidia.com/")}
    stale = {k: None for k in live["metadata"].get("labels", {}) if k.startswith("nvidia.com/") and k not in labels}
    metadata = {"metadata": {"labels": {**stale, **labels}, "annotations": {APPLIED: config}}}
    status: dict = {}
    for field in ("capacity", "allocatable"):
        old = {k for k in live["status"].get(field, {}) if k.startswith("nvidia.com/")}
        new = {k: v for k, v in wanted["status"][field].items() if k.startswith("nvidia.com/")}
        status[field] = {**{k: None for k in old - set(new)}, **new}
    return metadata, {"status": status}


def reconcile(kube, fleet: Fleet) -> None:  # noqa: ANN001 - kubeloop.kube.Kube
    """Apply every relabelled layout the fleet's MIG nodes do not advertise yet."""
    specs = {n.name: n for n in fleet.nodes if n.gpu and n.gpu.mig}
    for live in kube.list("v1", "Node"):
        name = live["metadata"]["name"]
        labels = live["metadata"].get("labels", {})
        applied = live["metadata"].get("annotations", {}).get(APPLIED) or (specs[name].gpu.mig.config
                                                                           if name in specs else None)
        wanted = labels.get(CONFIG_LABEL)
        if name not in specs or not wanted or wanted == applied:
            continue
        holders = [p["metadata"]["name"] for p in kube.list("v1", "Pod")
                   if p["spec"].get("nodeName") == name and p.get("status", {}).get("phase") in ("Pending", "Running")
                   and any(k.startswith("nvidia.com/") for c in p["spec"]["containers"]
                           for k in (c.get("resources", {}).get("limits") or {}))]
        try:
            if holders:
                raise RelayoutError(f"Pods still hold its GPUs: {', '.join(sorted(holders))}; drain the node first")
            relaid_node = relaid_spec(specs[name], wanted)
            metadata, status = node_patches(live, build_node(relaid_node, fleet), wanted)
        except RelayoutError as exc:
            if labels.get(STATE_LABEL) != "failed":
                log.warning("node %s: cannot apply %s: %s", name, wanted, exc)
                kube.merge_patch("v1", "Node", name, {"metadata": {"labels": {STATE_LABEL: "failed"}}})
            continue
        kube.merge_patch("v1", "Node", name, status, subresource="status")
        for resource_slice in build_resource_slices([relaid_node]):  # and as DRA publishes them
            kube.apply(resource_slice, field_manager="kubeloop-dev")
        kube.merge_patch("v1", "Node", name, metadata)
        log.info("node %s: re-partitioned to %s", name, wanted)


def main(argv: list[str] | None = None) -> int:
    from kubeloop.kube import Kube, KubeError

    parser = argparse.ArgumentParser(prog="python -m kubeloop.dev.migmanager")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--fleet", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fleet = load_fleet(args.fleet)
    kube = Kube.from_kubeconfig(args.kubeconfig)
    log.info("watching the MIG layouts of %d nodes", sum(1 for n in fleet.nodes if n.gpu and n.gpu.mig))
    while True:
        try:
            reconcile(kube, fleet)
        except (KubeError, OSError) as exc:  # the API server restarting: try again
            log.warning("reconcile failed: %s", exc)
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
