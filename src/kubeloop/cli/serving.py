"""`kubeloop serving`: put registered models into Triton model repositories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True, help="Triton model repositories.")


@app.command()
def fetch(
    model_uri: Annotated[str, typer.Argument(help="models:/<name>/<version>")],
    repository: Annotated[Path, typer.Option(help="The Triton model repository to write into.")],
    tracking_uri: Annotated[str, typer.Option(envvar="MLFLOW_TRACKING_URI", help="The MLflow server.")],
    backend: Annotated[str, typer.Option(help="Triton backend the repository is for: onnxruntime or python.")]
    = "onnxruntime",
    device: Annotated[str, typer.Option(help="Where the Pod runs the model: cpu or gpu (its instance group).")]
    = "cpu",
) -> None:
    """Write a registered version (its tuned config, or a default one) into a
    Triton repository: what a serving Pod's init container runs."""
    from kubeloop.serving.repository import fetch_for_kubernetes

    config = fetch_for_kubernetes(model_uri, repository, tracking_uri, backend, device)
    Console(stderr=True).print(f"wrote {config.parent}")


@app.command("storage-initializer")
def storage_initializer(
    model_uri: Annotated[str, typer.Argument(help="models:/<name>/<version>")],
    repository: Annotated[Path, typer.Argument(help="The Triton model repository to write into (/mnt/models).")],
    tracking_uri: Annotated[str, typer.Option(envvar="MLFLOW_TRACKING_URI", help="The MLflow server.")],
    backend: Annotated[str, typer.Option(envvar="KUBELOOP_TRITON_BACKEND",
                                         help="Triton backend the repository is for: onnxruntime or python.")]
    = "onnxruntime",
    device: Annotated[str, typer.Option(envvar="KUBELOOP_TRITON_DEVICE",
                                        help="Where the Pod runs the model: cpu or gpu (its instance group).")]
    = "cpu",
) -> None:
    """`fetch` in KServe's storage-initializer contract (the URI and the
    destination as arguments): the init container KServe injects into a
    predictor whose storageUri is a registry URI (ClusterStorageContainer)."""
    fetch(model_uri, repository, tracking_uri, backend, device or "cpu")


@app.command()
def skew(
    log: Annotated[str, typer.Argument(help="The InferenceService's request log: a folder or an s3:// prefix.")],
    model: Annotated[str, typer.Option(help="The registered model it serves.")],
    tracking_uri: Annotated[str, typer.Option(envvar="MLFLOW_TRACKING_URI", help="The MLflow server.")],
    sample: Annotated[int, typer.Option(help="Served rows to compare, at most.")] = 200,
    tolerance: Annotated[float, typer.Option(help="Relative difference above which a value differs.")] = 1e-5,
) -> None:
    """Compare a sample of the vectors served for entity requests with the
    offline store's point-in-time values for the same entities and times;
    exits 1 when any differ (training-serving skew) or none could be compared."""
    from mlflow import MlflowClient

    from kubeloop.requestlog import request_records
    from kubeloop.serving.skew import check_skew

    client = MlflowClient(tracking_uri)
    reports = check_skew(request_records(log), lambda v: client.get_model_version(model, v).tags, sample, tolerance)
    console = Console()
    for report in reports:
        console.print(f"version {report.version}: {report.compared} rows compared, {report.mismatched} differ "
                      f"(largest difference {report.max_difference:.3g}), {report.not_in_offline} past a view's "
                      "ttl in the offline store")
        for column, count in sorted(report.by_column.items()):
            console.print(f"  {column}: {count} rows differ")
        for example in report.examples:
            console.print(f"  e.g. {example}")
    if not reports:
        console.print(f"no entity-request rows in {log}")
    if not reports or not all(r.matches for r in reports):
        raise typer.Exit(1)


@app.command("pool-sync")
def pool_sync(
    routes: Annotated[Path, typer.Option(help="The pool's routes as the operator writes them (its ConfigMap).")],
    served: Annotated[Path, typer.Option(help="Where the routes go once their versions are fetched (the front reads it).")],
    repository: Annotated[Path, typer.Option(help="The Triton model repository the pool's members share.")],
    work: Annotated[Path, typer.Option(help="A folder for fetched files and each version's config.")],
    tracking_uri: Annotated[str, typer.Option(envvar="MLFLOW_TRACKING_URI", help="The MLflow server.")],
    backend: Annotated[str, typer.Option(help="Triton backend the repository is for: onnxruntime or python.")]
    = "onnxruntime",
) -> None:
    """Keep a pool Pod's repository in step with its routes, for ever: what
    the pool's repository container runs (kubeloop.serving.poolsync)."""
    import logging

    from kubeloop.serving.poolsync import PoolFolders, run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run(PoolFolders(routes, served, repository, work), tracking_uri, backend)
