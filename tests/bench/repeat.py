"""Repeated figures for `make bench`: every figure is the median of at least
RUNS runs with its spread, and a spread over SPREAD_LIMIT is flagged, so a
reader can tell a measured difference from the machine's noise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeVar

from kubeloop.components.intervals import summary

RUNS = 5
SPREAD_LIMIT = 0.10
"""(max - min) / median over the runs above which a figure is flagged."""
T = TypeVar("T")
if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class Figure:
    name: str
    values: list[float]
    unit: str = ""

    @property
    def median(self) -> float:
        return summary(self.values)[0]

    @property
    def spread(self) -> float:
        return summary(self.values)[1]

    @property
    def flagged(self) -> bool:
        return self.spread > SPREAD_LIMIT

    def to_json(self) -> dict:
        return {"median": self.median, "spread": round(self.spread, 4), "runs": self.values,
                "unit": self.unit, "flagged": self.flagged}


def repeat(run: Callable[[int], T], runs: int = RUNS) -> list[T]:
    """run(i) for i in 0..runs-1, in order."""
    return [run(i) for i in range(runs)]


def figures(results: list[dict], units: dict[str, str]) -> list[Figure]:
    """One Figure per key of units, gathered from each run's results."""
    return [Figure(name, [float(r[name]) for r in results], unit) for name, unit in units.items()]


def figures_table(title: str, rows: list[Figure]) -> Table:
    from rich.table import Table  # here: the GPU suite uses the figures on machines without rich

    table = Table(title=title)
    for column in ("figure", "median", "spread", "runs", "flag"):
        table.add_column(column, justify="left" if column in ("figure", "flag") else "right")
    for f in rows:
        table.add_row(f.name, f"{f.median:,.4g} {f.unit}".strip(), f"{f.spread:.1%}", str(len(f.values)),
                      f"[bold red]SPREAD > {SPREAD_LIMIT:.0%}[/]" if f.flagged else "")
    return table
