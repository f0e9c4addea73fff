"""`kubeloop placement plan`: where InferenceServices would run on the live
fleet, and the MIG layout per node that would hold them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, help="GPU placement on the fleet.")


@app.command()
def plan(
    namespace: Annotated[Optional[str], typer.Option("--namespace", "-n",
                                                     help="Only this namespace's InferenceServices.")] = None,
    filename: Annotated[Optional[list[Path]], typer.Option("--filename", "-f",
                                                           help="Plan these manifests instead of the live objects.")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(envvar="MLFLOW_TRACKING_URI",
                                                        help="Read measured footprints from this registry.")] = None,
) -> None:
    """Plan every InferenceService against the fleet and suggest MIG layouts."""
    from kubeloop.api.resources import INFERENCE_SERVICE
    from kubeloop.api.serving import InferenceServiceSpec
    from kubeloop.gpu.mig import mig_parted_config
    from kubeloop.gpu.placement import plan as plan_one, suggest_layouts
    from kubeloop.operator.fleet import observe_fleet
    from kubeloop.operator.kube import Kube

    kube = Kube.from_kubeconfig()
    if filename:
        objects = [d for f in filename for d in yaml.safe_load_all(f.read_text())
                   if d and d.get("kind") == INFERENCE_SERVICE.kind]
    else:
        objects = kube.list(INFERENCE_SERVICE.api_version, INFERENCE_SERVICE.kind, namespace)
    nodes = observe_fleet(kube)
    registry = None
    if tracking_uri:
        from kubeloop.registry.mlflow import MlflowRegistry

        registry = MlflowRegistry(tracking_uri)
    table = Table("inference service", "sharing", "footprint MiB", "resource", "nodes", "why")
    demands = []
    for obj in objects:
        spec = InferenceServiceSpec.model_validate(obj["spec"])
        footprint = None
        if registry and spec.gpu and not spec.gpu.memory_mib:
            from kubeloop.registry.tags import GPU_MEMORY_MIB

            version = registry.resolve(spec.model.name, spec.model.version, spec.model.alias)
            footprint = int(version.tags[GPU_MEMORY_MIB]) if version and GPU_MEMORY_MIB in version.tags else None
        decision = plan_one(spec.gpu, footprint, nodes, spec.replicas)
        demands.append((spec.gpu, footprint, spec.autoscaling.min_replicas if spec.autoscaling else spec.replicas))
        name = f"{obj['metadata'].get('namespace', namespace or 'default')}/{obj['metadata']['name']}"
        table.add_row(name, spec.gpu.sharing if spec.gpu else "cpu", str(decision.footprint_mib or "-"),
                      next(iter(decision.resources), "-") if decision.feasible else "[red]none[/red]",
                      ", ".join(decision.nodes) or "-", decision.reason)
    console = Console()
    console.print(table)
    for layout in suggest_layouts(demands, nodes):
        if layout.error:
            console.print(f"[red]{layout.node}[/red]: {layout.error}")
            continue
        change = "keep" if layout.current == layout.suggested else f"label nvidia.com/mig.config={layout.suggested}"
        console.print(f"[bold]{layout.node}[/bold] ({layout.product}): needs {layout.demand}; "
                      f"current {layout.current or '-'} -> {change} (drain the node first)")
        if layout.suggested.startswith("kubeloop-"):
            console.print(yaml.safe_dump(mig_parted_config(layout.suggested, list(layout.layouts)), sort_keys=False))
