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
def add_period(repo: Repo, days: int = 14, drift: float = 1.0, seed: int = 11) -> None:
    """Append a newer period of data (by default a drifted one) and materialise it."""
    from datetime import timedelta

    import pandas as pd

    from kubeloop.featurestore.generate import Scenario
    from kubeloop.featurestore.store import append_period, materialize as materialize_views

    last = pd.read_parquet(repo / "data" / "transactions.parquet", columns=["event_timestamp"])["event_timestamp"].max()
    start = (last + timedelta(seconds=1)).to_pydatetime()
    counts = append_period(repo, Scenario(start=start, days=days, drift=drift, seed=seed))
    materialize_views(repo)
    console.print(f"appended {counts['transactions']} transactions from {start:%Y-%m-%d} (drift {drift})")


def main() -> None:
    os.environ.setdefault("FEAST_USAGE", "False")
    app()


if __name__ == "__main__":
    main()
