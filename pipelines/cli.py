"""`kubeloop pipelines`: compile the pipelines to IR for the Kubeflow Pipelines UI."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True, help="Kubeflow pipelines (compiled IR).")


@app.command()
def compile(output: Annotated[Optional[Path], typer.Option(
        help="Folder for the IR files (default: pipelines/compiled in the package).")] = None) -> None:
    """Compile every kubeloop pipeline to IR YAML (what the KFP UI uploads)."""
    from kubeloop.pipelines.optimization import compile_optimization
    from kubeloop.pipelines.training import COMPILED, compile_training

    folder = output or COMPILED.parent
    written = [compile_training(folder / "training.yaml"), compile_optimization(folder / "optimization.yaml")]
    Console(stderr=True).print("wrote " + ", ".join(str(p) for p in written))
