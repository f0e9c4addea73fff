"""`kubeloop features`: drive the Feast repository through Feast's Python API."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True, help="The Feast feature repository (card-transaction fraud).")
console = Console(stderr=True)
Repo = Annotated[Path, typer.Option("--repo", envvar="KUBELOOP_FEAST_REPO",
                                    help="The feature repository folder (`kubeloop dev env` prints it).")]


@app.command()
def init(repo: Repo, days: int = 45, drift: float = 0.0, seed: int = 7,
         end_days_ago: Annotated[int, typer.Option(help="Leave this many recent days for add-period.")] = 0,
         redis: Annotated[str, typer.Option(help="Keep the online store in Redis at HOST:PORT (default: sqlite in "
                                                 "the repository).")] = "") -> None:
    """Create a repository: configuration, generated data, definitions applied."""
    from kubeloop.featurestore.generate import Scenario, default_start
    from kubeloop.featurestore.store import create_repository

    create_repository(repo, Scenario(start=default_start(days + end_days_ago), days=days, drift=drift, seed=seed),
                      redis_address=redis)
    console.print(f"feature repository ready in {repo}")


@app.command()
def apply(repo: Repo) -> None:
    """Register the example's entities, sources and feature views (feast apply; the example repository only)."""
    from kubeloop.featurestore.store import apply as apply_definitions

    console.print("applied: " + ", ".join(apply_definitions(repo)))


@app.command()
def materialize(repo: Repo, end: Annotated[Optional[datetime], typer.Option(
        help="Materialise up to this time (default: now).")] = None) -> None:
    """Load the latest feature values into the online store."""
    from kubeloop.featurestore.store import materialize as materialize_views

    console.print(f"materialised up to {materialize_views(repo, end).isoformat()}")


@app.command("add-period")
def add_period(repo: Repo, days: int = 14, drift: float = 1.0, seed: int = 11,
               materialize: Annotated[bool, typer.Option(
                   help="Materialise right away; --no-materialize leaves it to a schedule (an InferenceService's "
                        "spec.features.materializeEvery).")] = True) -> None:
    """Replace the last DAYS up to now with a world of their own (drifted by default), feature snapshots as of now."""
    from kubeloop.featurestore.store import materialize as materialize_views, recent_period, write_period

    scenario = recent_period(days, drift, seed)
    counts = write_period(repo, scenario)
    if materialize:
        materialize_views(repo)
    console.print(f"{counts['transactions']} transactions from {scenario.start:%Y-%m-%d %H:%M} to now (drift {drift})"
                  + ("" if materialize else "; not materialised"))


def main() -> None:
    os.environ.setdefault("FEAST_USAGE", "False")
    app()


if __name__ == "__main__":
    main()
