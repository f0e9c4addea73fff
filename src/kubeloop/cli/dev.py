"""`kubeloop dev`: the local platform."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from kubeloop.dev.platform import Platform, PlatformError

app = typer.Typer(no_args_is_help=True, help="Run the whole platform on this machine.")
console = Console(stderr=True)
StateDir = Annotated[Optional[Path], typer.Option("--state-dir", envvar="KUBELOOP_STATE_DIR",
                                                  help="Where the platform keeps its state and logs.")]


@app.command()
def up(state_dir: StateDir = None) -> None:
    """Start etcd, the Kubernetes control plane and KWOK's fake GPU fleet."""
    platform = Platform(state_dir)
    try:
        with console.status("starting the platform") as status:
            platform.up(progress=lambda msg: status.update(msg))
    except PlatformError as exc:
        console.print(f"[red]the platform did not come up:[/red] {exc}")
        raise typer.Exit(1) from None
    state = platform.state()
    console.print(f"[green]platform up[/green] in {state.ready_seconds} s; "
                  f"run [bold]eval $(kubeloop dev env)[/bold]")


@app.command()
def down(state_dir: StateDir = None) -> None:
    """Stop every process `up` started and remove the state."""
    Platform(state_dir).down()
    console.print("platform down")


@app.command()
def status(state_dir: StateDir = None) -> None:
    """Show each platform process."""
    platform = Platform(state_dir)
    rows = platform.status()
    if not rows:
        console.print("the platform is not up")
        raise typer.Exit(1)
    table = Table("component", "state", "pid", "log")
    for name, row in rows.items():
        table.add_row(name, "[green]running[/green]" if row["running"] else "[red]stopped[/red]",
                      str(row["pid"]), row["log"])
    Console().print(table)
    if not all(r["running"] for r in rows.values()):
        raise typer.Exit(1)


@app.command()
def env(state_dir: StateDir = None) -> None:
    """Print `export` lines for the platform: KUBECONFIG, service URLs, and a
    PATH that puts the pinned kubectl and helm first."""
    platform = Platform(state_dir)
    values = platform.env()
    if not values:
        console.print("the platform is not up")
        raise typer.Exit(1)
    values["PATH"] = platform.tool_path()
    for key, value in values.items():
        print(f"export {key}={shlex.quote(value)}")
