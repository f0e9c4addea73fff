"""Packing a pool's models onto its members by their sizes (pure: plain data
in, a plan out; `kubeloop placement plan` shows it).

A pool loads models by traffic, so the plan is not where each model must
be: it is which models the members can hold at once (largest first, each
onto the member with the most room left, within each member's budget less
the headroom the pool keeps free), and which are left to be loaded on
demand, unloading the least recently used. Sizes are what the pool
measured when it loaded the model (the host memory its member grew by),
else the pool's estimate for a model never loaded. An OptimizedModel's
footprint is GPU memory, and no pool here measures a GPU: it sizes
nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PooledModel:
    name: str
    size_mib: float | None
    source: str
    """Where the size comes from: measured (by the pool), estimate, or unknown."""


@dataclass(frozen=True)
class MemberPlan:
    name: str
    models: tuple[str, ...]
    used_mib: float


@dataclass(frozen=True)
class PoolPlan:
    budget_mib: float
    """Each member's room for models: its memory less the headroom."""
    members: tuple[MemberPlan, ...]
    on_demand: tuple[str, ...]
    """Models the members cannot hold beside the others: loaded by traffic."""
    too_large: tuple[str, ...]
    """Models larger than a member's room: the pool cannot serve them."""
    unknown: tuple[str, ...]
    """Models of no known size (never loaded, no footprint, no estimate)."""


def pack(models: list[PooledModel], members: int, memory_mib: float, headroom: float) -> PoolPlan:
    """The members' names are member-0 .. member-(members-1), as the pool names them."""
    budget = memory_mib * (1 - headroom)
    held: dict[str, list[str]] = {f"member-{i}": [] for i in range(members)}
    used = dict.fromkeys(held, 0.0)
    on_demand, too_large = [], []
    sized = sorted((m for m in models if m.size_mib is not None), key=lambda m: (-m.size_mib, m.name))
    for model in sized:
        if model.size_mib > budget:
            too_large.append(model.name)
            continue
        roomiest = min(held, key=lambda name: (used[name], name))
        if used[roomiest] + model.size_mib <= budget:
            held[roomiest].append(model.name)
            used[roomiest] += model.size_mib
        else:
            on_demand.append(model.name)
    return PoolPlan(budget, tuple(MemberPlan(name, tuple(held[name]), round(used[name], 1)) for name in held),
                    tuple(on_demand), tuple(too_large), tuple(m.name for m in models if m.size_mib is None))
