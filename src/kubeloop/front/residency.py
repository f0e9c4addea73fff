"""Which models a pool's Triton members hold, and where the next request for
a model goes (pure: plain data in, decisions out; the I/O is kubeloop.front.pool).

A member is a Triton server in explicit model-control mode with a memory
budget. A model is loaded on its first request and stays until room is
needed for another: then the members' least recently used models that no
request is using are unloaded first. Sizes are measured ones (what the
member grew by when it loaded the model); until a model's first load is measured, the caller gives an estimate,
and a load measured larger than its room makes the member unload idle models
until it is within its budget again.

A hot model is spread: where every member holding it has `spread_at` of its
requests under way, the next request also starts a copy's load on another
member with room (requests keep going to the members that hold it loaded
meanwhile); the copy is unloaded like any other once it is idle and room
is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


class NoRoom(RuntimeError):
    """No member can hold the model now: what they hold is in use."""


class TooLarge(NoRoom):
    """The model is larger than any member's budget: waiting will not help."""


@dataclass
class Member:
    name: str
    budget_mib: float
    loaded: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Model -> measured size (MiB), least recently used first."""
    loading: dict[str, float] = field(default_factory=dict)
    """Models being loaded -> the size they were given room for."""
    in_use: dict[str, int] = field(default_factory=dict)
    """Model -> callers' requests under way (such a model is never unloaded;
    a call carrying several joined requests counts each)."""
    observed_mib: float = 0.0
    """What the member was last measured to use over its empty self: more
    than its models' sizes where they share memory no one size holds (the
    backend's libraries, loaded with the first model)."""

    @property
    def used_mib(self) -> float:
        return max(sum(self.loaded.values()), self.observed_mib) + sum(self.loading.values())

    def drop(self, model: str) -> float:
        """The model is unloaded: its size leaves the member's last measure
        too (which held it), so that measure is not stale until the next."""
        size = self.loaded.pop(model)
        self.observed_mib = max(self.observed_mib - size, 0.0)
        return size

    def holds(self, model: str) -> bool:
        return model in self.loaded or model in self.loading

    def idle_lru(self) -> list[str]:
        """Loaded models no request uses, least recently used first."""
        return [m for m in self.loaded if not self.in_use.get(m)]


@dataclass(frozen=True)
class Placement:
    """Where a request for a model goes."""

    member: str
    load: bool
    """The member must load the model first (a cold load)."""
    unload: tuple[str, ...] = ()
    """Models the member unloads first, to make room."""
    spread: "Placement | None" = None
    """A copy of the (hot) model to load on another member meanwhile; its
    room is reserved and it is in use until the load ends (done())."""


@dataclass
class Counters:
    hits: int = 0
    """Requests to a model already loaded (or loading) on a member."""
    loads: int = 0
    """Loads started."""
    failed: int = 0
    """Loads that failed."""
    unloads: int = 0
    spreads: int = 0
    """Loads of a hot model's copy on another member (counted in loads too)."""


class Residency:
    """The pool's members and what each holds."""

    def __init__(self, budgets: dict[str, float], spread_at: int = 0):
        if not budgets:
            raise ValueError("a pool needs at least one member")
        self.members = {name: Member(name, budget) for name, budget in budgets.items()}
        self.counters = Counters()
        self.spread_at = spread_at
        """Requests under way to a model on each member holding it from which it is spread (0: never)."""

    def place(self, model: str, size_mib: float, requests: int = 1) -> Placement:
        """The member for a request to model: the least busy member holding
        it loaded (or loading, where none has it loaded yet; a hot model's
        copy may start loading elsewhere: spread), else the one that must unload the least to make room (then the
        one with most room left). size_mib: its measured size, or an
        estimate until its first load is measured (loaded() corrects it).
        The placement takes effect at once (room reserved, models to unload
        dropped), so concurrent requests see it; a cold one finishes with
        loaded() or failed(), and every one with done(). requests: the
        callers' requests the call carries."""
        holders = [m for m in self.members.values() if m.holds(model)]
        if holders:
            ready = [m for m in holders if model in m.loaded]
            member = min(ready or holders, key=lambda m: sum(m.in_use.values()))
            self.counters.hits += 1
            self._use(member, model, requests)
            return Placement(member.name, load=False, spread=self._spread(model, size_mib, holders))
        name, unload = self._room(model, size_mib)
        return self._reserve(self.members[name], model, size_mib, unload, requests)

    def _reserve(self, member: Member, model: str, size_mib: float, unload: list[str],
                 requests: int = 1) -> Placement:
        for evicted in unload:
            member.drop(evicted)
        self.counters.unloads += len(unload)
        self.counters.loads += 1
        member.loading[model] = size_mib
        self._use(member, model, requests)
        return Placement(member.name, load=True, unload=tuple(unload))

    def _spread(self, model: str, size_mib: float, holders: list[Member]) -> Placement | None:
        """A copy of the model on another member, where every member holding
        it has spread_at of its requests under way (this one counted) and
        another member has room (unloading idle models only)."""
        if not self.spread_at or any(m.in_use.get(model, 0) < self.spread_at for m in holders):
            return None
        names = {m.name for m in holders}
        best = self._best(size_mib, [m for m in self.members.values() if m.name not in names])
        if best is None:
            return None
        self.counters.spreads += 1
        return self._reserve(self.members[best[0]], model, size_mib, best[1])

    def _room(self, model: str, size_mib: float) -> tuple[str, list[str]]:
        largest = max(m.budget_mib for m in self.members.values())
        if size_mib > largest:
            raise TooLarge(f"{model} ({size_mib:.0f} MiB) is larger than any pool member's budget (at most "
                           f"{largest:.0f} MiB): give the pool larger members, or serve it on its own")
        best = self._best(size_mib, list(self.members.values()))
        if best is None:
            budgets = ", ".join(f"{m.name} {m.budget_mib:.0f} MiB" for m in self.members.values())
            raise NoRoom(f"no pool member has room for {model} ({size_mib:.0f} MiB): budgets {budgets}, "
                         "less what requests under way use")
        return best

    @staticmethod
    def _best(size_mib: float, members: list[Member]) -> tuple[str, list[str]] | None:
        """Of the members with room for a model of size_mib once they unload
        idle models (least recently used first), the one that unloads the
        fewest, then keeps the most room: its name and those models."""
        options = []
        for member in members:
            free, unload = member.budget_mib - member.used_mib, []
            for candidate in member.idle_lru():
                if free >= size_mib:
                    break
                free += member.loaded[candidate]
                unload.append(candidate)
            if free >= size_mib:
                options.append((len(unload), -free, member.name, unload))
        if not options:
            return None
        _, _, name, unload = min(options, key=lambda option: option[:3])
        return name, unload

    def copies(self, model: str) -> int:
        """Members holding the model loaded."""
        return sum(model in m.loaded for m in self.members.values())

    def busy(self, model: str) -> bool:
        """Whether every member holding the model loaded has spread_at of
        its requests under way (never where spread_at is 0)."""
        holders = [m for m in self.members.values() if model in m.loaded]
        return bool(self.spread_at and holders and all(m.in_use.get(model, 0) >= self.spread_at for m in holders))

    def held(self, model: str) -> bool:
        """Whether a member holds (or is loading) the model."""
        return any(m.holds(model) for m in self.members.values())

    def observe(self, member: str, used_mib: float) -> None:
        """The member's measured use, over its memory holding no model."""
        self.members[member].observed_mib = used_mib

    def loaded(self, member: str, model: str, measured_mib: float) -> list[str]:
        """A load finished; the member holds the model at its measured size.
        Where that is more than the room it was given, the idle models the
        member must unload to be within its budget again (least recently
        used first; dropped here and counted)."""
        m = self.members[member]
        m.loading.pop(model, None)
        m.loaded[model] = measured_mib
        m.loaded.move_to_end(model)
        m.observed_mib += measured_mib  # measured before this load
        unload = []
        for candidate in m.idle_lru():
            if m.used_mib <= m.budget_mib:
                break
            m.drop(candidate)
            unload.append(candidate)
        self.counters.unloads += len(unload)
        return unload

    def failed(self, member: str, model: str) -> None:
        """A load failed: the room it held is free again (its request still
        ends with done())."""
        self.members[member].loading.pop(model, None)
        self.counters.failed += 1

    def done(self, member: str, model: str, requests: int = 1) -> None:
        """A call to the model on the member is over (carrying `requests`)."""
        m = self.members[member]
        left = m.in_use.get(model, 0) - requests
        if left > 0:
            m.in_use[model] = left
        else:
            m.in_use.pop(model, None)

    def evict_idle(self, member: str) -> str | None:
        """Drop the member's least recently used idle model (counted as an
        unload; the caller unloads it), or None when every model is in use."""
        m = self.members[member]
        idle = m.idle_lru()
        if not idle:
            return None
        m.drop(idle[0])
        self.counters.unloads += 1
        return idle[0]

    def forget(self, model: str) -> list[str]:
        """The model is served no more: the members that held it loaded drop
        it (counted as unloads; the caller unloads it there)."""
        held = [m.name for m in self.members.values() if model in m.loaded]
        for name in held:
            self.members[name].drop(model)
        self.counters.unloads += len(held)
        return held

    def emptied(self, member: str) -> list[str]:
        """The member started again and holds nothing: the models it held
        are loaded again where they are next requested (not counted as
        unloads: nobody unloaded them)."""
        m = self.members[member]
        gone = list(m.loaded)
        m.loaded.clear()
        m.observed_mib = 0.0
        return gone

    def over_budget(self) -> dict[str, float]:
        """Members whose measured models exceed their budget, by how much
        (a load measured larger than the room it was given)."""
        return {m.name: m.used_mib - m.budget_mib for m in self.members.values() if m.used_mib > m.budget_mib}

    def _use(self, member: Member, model: str, requests: int = 1) -> None:
        member.in_use[model] = member.in_use.get(model, 0) + requests
        if model in member.loaded:
            member.loaded.move_to_end(model)
