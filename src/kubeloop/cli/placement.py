"""`kubeloop placement plan`: where InferenceServices would run on the live
fleet, and the MIG layout per node that would hold them."""

from __future__ import annotations

import json
import shutil
import textwrap
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml

app = typer.Typer(no_args_is_help=True, help="GPU placement on the fleet.")


class Output(str, Enum):
    text = "text"
    yaml = "yaml"
    json = "json"


@app.command()
def plan(
    namespace: Annotated[Optional[str], typer.Option("--namespace", "-n",
                                                     help="Only this namespace's InferenceServices.")] = None,
    filename: Annotated[Optional[list[Path]], typer.Option("--filename", "-f",
                                                           help="Plan these manifests instead of the live objects.")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(envvar="MLFLOW_TRACKING_URI",
                                                        help="Read measured footprints from this registry.")] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="text (80 columns), yaml or json.")] = Output.text,
    gpu_allocation: Annotated[str, typer.Option(envvar="KUBELOOP_GPU_ALLOCATION",
                                                help="dra: also plan for GPUs published as partitionable "
                                                     "DRA devices, as the operator does.")] = "device-plugin",
) -> None:
    """Plan every InferenceService against the fleet and suggest MIG layouts."""
    from kubeloop.api.resources import INFERENCE_SERVICE
    from kubeloop.operator.fleet import observe_fleet
    from kubeloop.kube import Kube

    kube = Kube.from_kubeconfig()
    if filename:
        objects = [d for f in filename for d in yaml.safe_load_all(f.read_text())
                   if d and d.get("kind") == INFERENCE_SERVICE.kind]
    else:
        objects = kube.list(INFERENCE_SERVICE.api_version, INFERENCE_SERVICE.kind, namespace)
    registry = None
    if tracking_uri:
        from kubeloop.registry.mlflow import MlflowRegistry

        registry = MlflowRegistry(tracking_uri)
    report = build_report(objects, observe_fleet(kube, dra=gpu_allocation == "dra"), registry, namespace or "default")
    if output is Output.json:
        print(json.dumps(report, indent=2))
    elif output is Output.yaml:
        print(yaml.safe_dump(report, sort_keys=False), end="")
    else:
        print(render_text(report, shutil.get_terminal_size((80, 24)).columns))


def build_report(objects: list[dict], nodes: list, registry, namespace: str) -> dict:  # noqa: ANN001
    """Each InferenceService's placement, and the MIG layout per node that
    would hold them all, as plain data (what -o yaml|json prints)."""
    from kubeloop.api.serving import InferenceServiceSpec
    from kubeloop.gpu.mig import mig_parted_config
    from kubeloop.gpu.placement import plan as plan_one, suggest_layouts

    services, demands = [], []
    for obj in objects:
        spec = InferenceServiceSpec.model_validate(obj["spec"])
        footprint = _measured_footprint(registry, spec)
        replicas = spec.autoscaling.min_replicas if spec.autoscaling else spec.replicas
        decision = plan_one(spec.gpu, footprint, nodes, replicas)
        demands.append((spec.gpu, footprint, replicas))
        services.append({
            "name": f"{obj['metadata'].get('namespace', namespace)}/{obj['metadata']['name']}",
            "sharing": spec.gpu.sharing if spec.gpu else "cpu", "footprintMib": decision.footprint_mib,
            "feasible": decision.feasible, "resources": dict(decision.resources), "nodes": list(decision.nodes),
            "reason": decision.reason,
            **({"relayout": {"node": decision.relayout.node, "config": decision.relayout.config,
                             "moves": dict(decision.relayout.moves)}} if decision.relayout else {})})
    layouts = []
    for layout in suggest_layouts(demands, nodes):
        entry = {"node": layout.node, "product": layout.product, "current": layout.current,
                 "suggested": layout.suggested, "demand": dict(layout.demand), "layouts": list(layout.layouts)}
        if layout.error:
            entry["error"] = layout.error
        elif layout.suggested.startswith("kubeloop-"):
            entry["migPartedConfig"] = mig_parted_config(layout.suggested, list(layout.layouts))
        layouts.append(entry)
    return {"services": services, "layouts": layouts}


def _measured_footprint(registry, spec) -> int | None:  # noqa: ANN001
    if registry is None or not spec.gpu or spec.gpu.memory_mib:
        return None
    from kubeloop.registry.tags import GPU_MEMORY_MIB

    version = registry.resolve(spec.model.name, spec.model.version, spec.model.alias)
    return int(version.tags[GPU_MEMORY_MIB]) if version and GPU_MEMORY_MIB in version.tags else None


def render_text(report: dict, width: int = 80) -> str:
    """The report for a terminal: one block per service, reasons wrapped to
    the width (never under 60 columns), then the layout advice."""
    width = max(60, width)
    lines: list[str] = []

    def wrapped(text: str, indent: str = "    ") -> None:
        lines.extend(textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent,
                                   break_on_hyphens=False))

    for service in report["services"]:
        resource = next(iter(service["resources"]), None)
        where = (f"{resource} on {', '.join(service['nodes'])}" if service["feasible"]
                 else "fits after a relayout" if "relayout" in service else "no fitting capacity")
        footprint = f"{service['footprintMib']} MiB" if service["footprintMib"] else "-"
        wrapped(f"{service['name']}  {service['sharing']}  {footprint}  -> {where}", indent="")
        wrapped(service["reason"])
    for layout in report["layouts"]:
        lines.append("")
        if "error" in layout:
            wrapped(f"{layout['node']}: {layout['error']}", indent="")
            continue
        change = ("keep it" if layout["current"] == layout["suggested"]
                  else f"label nvidia.com/mig.config={layout['suggested']} (drain the node first)")
        wrapped(f"{layout['node']} ({layout['product']}): needs {layout['demand']}; current "
                f"{layout['current'] or '-'} -> {change}", indent="")
        if "migPartedConfig" in layout:
            lines.extend(yaml.safe_dump(layout["migPartedConfig"], sort_keys=False).rstrip().splitlines())
    return "\n".join(lines)
