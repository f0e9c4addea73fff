"""`kubeloop placement plan`: where InferenceServices would run on the live
fleet, the MIG layout per node that would hold them, and how each pool's
models pack onto its members."""

from __future__ import annotations

import json
import shutil
from collections import Counter
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
    pools: Annotated[str, typer.Option(envvar="KUBELOOP_SERVING_POOLS",
                                       help="The pools as the operator sizes them (its KUBELOOP_SERVING_POOLS): "
                                            "pooled services are packed onto their members.")] = "{}",
) -> None:
    """Plan every InferenceService against the fleet and suggest MIG layouts;
    pack each pool's models onto its members."""
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
    sizes = _pool_sizes(pools)
    measured = {} if filename else _measured_in_pools(objects)
    report = build_report(objects, observe_fleet(kube, dra=gpu_allocation == "dra"), registry, namespace or "default",
                          sizes, measured)
    if output is Output.json:
        print(json.dumps(report, indent=2))
    elif output is Output.yaml:
        print(yaml.safe_dump(report, sort_keys=False), end="")
    else:
        print(render_text(report, shutil.get_terminal_size((80, 24)).columns))


def _pool_sizes(text: str) -> dict:
    from pydantic import TypeAdapter, ValidationError

    from kubeloop.serving.base import PoolSize

    try:
        return TypeAdapter(dict[str, PoolSize]).validate_json(text)
    except ValidationError as exc:
        raise typer.BadParameter(f"KUBELOOP_SERVING_POOLS (--pools) is not a pool map such as "
                                 f'{{"shared": {{"members": 2, "memoryMiB": 4096}}}}: {exc}') from exc


def _measured_in_pools(objects: list[dict]) -> dict[str, dict[str, float]]:
    """Pool -> model -> size measured by the pool's front (its /pool), for
    the pools the services name; a pool whose front does not answer has none."""
    import requests

    fronts = {o["spec"]["pool"]: o.get("status", {}).get("url") for o in objects if o["spec"].get("pool")}
    measured = {}
    for pool, url in fronts.items():
        try:
            answer = requests.get(f"{url}/pool", timeout=5)
            answer.raise_for_status()
            measured[pool] = answer.json()["sizesMiB"]
        except (requests.RequestException, ValueError, KeyError, TypeError):
            continue
    return measured


def build_report(objects: list[dict], nodes: list, registry, namespace: str,  # noqa: ANN001
                 pools: dict | None = None, measured: dict[str, dict[str, float]] | None = None) -> dict:
    """Each InferenceService's placement, the MIG layout per node that
    would hold them all, and each pool's packing (pools: name -> PoolSize;
    measured: pool -> Triton model -> MiB), as plain data (what -o yaml|json
    prints)."""
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
            "reason": decision.reason, **({"pool": spec.pool} if spec.pool else {}),
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
    return {"services": services, "layouts": layouts,
            "pools": pool_report(objects, pools or {}, measured or {}, namespace)}


def pool_report(objects: list[dict], pools: dict, measured: dict[str, dict[str, float]],
                namespace: str) -> list[dict]:
    """Each pool the services name: its models' sizes and where they come
    from, and how many the members hold at once (kubeloop.gpu.pools). A
    pool's sizes are host memory, as its front measures them: an
    OptimizedModel's footprint, GPU memory, is not one of them."""
    from kubeloop.front.pool import HEADROOM
    from kubeloop.gpu.pools import pack
    from kubeloop.serving.base import triton_name

    by_pool: dict[str, list[dict]] = {}
    for obj in objects:
        if obj["spec"].get("pool"):
            by_pool.setdefault(obj["spec"]["pool"], []).append(obj)
    report = []
    for name, members in sorted(by_pool.items()):
        size = pools.get(name)
        if size is None:
            report.append({"name": name, "error": f"no pool '{name}' in KUBELOOP_SERVING_POOLS (named: "
                                                  f"{', '.join(sorted(pools)) or 'none'})"})
            continue
        models = [_pooled_model(triton_name(f"{obj['metadata'].get('namespace', namespace)}.{obj['metadata']['name']}"),
                                measured.get(name, {}), size.estimate_mib) for obj in members]
        plan = pack(models, size.members, size.memory_mib, HEADROOM)
        report.append({
            "name": name, "members": size.members, "memoryMib": size.memory_mib, "headroom": HEADROOM,
            "budgetMib": round(plan.budget_mib, 1),
            "models": [{"model": m.name, "sizeMib": m.size_mib, "source": m.source} for m in models],
            "held": {m.name: {"models": list(m.models), "usedMib": m.used_mib} for m in plan.members},
            "onDemand": list(plan.on_demand), "tooLarge": list(plan.too_large), "unknown": list(plan.unknown)})
    return report


def _pooled_model(model: str, measured: dict[str, float], estimate: float):  # noqa: ANN202
    from kubeloop.gpu.pools import PooledModel

    if model in measured:
        return PooledModel(model, measured[model], "measured")
    return PooledModel(model, estimate, "estimate") if estimate else PooledModel(model, None, "unknown")


def _measured_footprint(registry, spec) -> int | None:  # noqa: ANN001
    """The model version's measured footprint (the OptimizedModel's), where
    the registry holds one and the spec sets no GPU memory of its own."""
    if registry is None or not spec.gpu or spec.gpu.memory_mib:
        return None
    from kubeloop.registry.tags import GPU_MEMORY_MIB

    version = registry.resolve(spec.model.name, spec.model.version, spec.model.alias)
    return int(version.tags[GPU_MEMORY_MIB]) if version and GPU_MEMORY_MIB in version.tags else None


def render_text(report: dict, width: int = 80) -> str:
    """The report for a terminal: one block per service, reasons wrapped to
    the width (never under 60 columns), then the layout advice, then the pools."""
    width = max(60, width)
    lines: list[str] = []

    def wrapped(text: str, indent: str = "    ") -> None:
        lines.extend(textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent,
                                   break_on_hyphens=False))

    for service in report["services"]:
        resource = next(iter(service["resources"]), None)
        where = (f"pool {service['pool']}" if service.get("pool") else "CPU" if resource is None and service["feasible"]
                 else f"{resource} on {', '.join(service['nodes'])}" if service["feasible"]
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
    for pool in report.get("pools", []):
        lines.append("")
        _pool_lines(pool, wrapped)
    return "\n".join(lines)


def _pool_lines(pool: dict, wrapped) -> None:  # noqa: ANN001 - render_text's wrapper
    if "error" in pool:
        wrapped(f"pool {pool['name']}: {pool['error']}", indent="")
        return
    sources = Counter(model["source"] for model in pool["models"])
    wrapped(f"pool {pool['name']}: {pool['members']} members x {round(pool['memoryMib'], 1):g} MiB ({pool['budgetMib']:g} "
            f"MiB for models after {pool['headroom']:.0%} headroom); {len(pool['models'])} models, sizes "
            + ", ".join(f"{n} {source}" for source, n in sorted(sources.items())), indent="")
    for member, held in pool["held"].items():
        wrapped(f"{member}: {len(held['models'])} at once, {held['usedMib']:g} MiB: {', '.join(held['models'])}")
    for key, what in (("onDemand", "loaded on demand (least recently used unloaded)"),
                      ("tooLarge", "larger than a member's room: not servable here"),
                      ("unknown", "size unknown until loaded once")):
        if pool[key]:
            wrapped(f"{what}: {len(pool[key])}: {', '.join(pool[key])}")
