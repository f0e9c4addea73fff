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
) -> None:
    """Write a registered version (its tuned config, or a default one) into a
    Triton repository: what a serving Pod's init container runs."""
    from kubeloop.serving.repository import fetch_for_kubernetes

    config = fetch_for_kubernetes(model_uri, repository, tracking_uri, backend)
    Console(stderr=True).print(f"wrote {config.parent}")
