"""A seeded simulation of a fleet of rotating machines for the maintenance example.

A team that predicts faults would have telemetry, site weather and a log of
inspections; none can be downloaded here, so this module simulates them.
Every machine runs hour by hour through a hidden state: healthy, or one of
three faults that develops, shows in its sensors and lasts until a service.
The tables it writes are what the team's pipelines would publish:

- machine_telemetry: per machine, every hour, statistics of the past hour
  (the snapshot at t covers [t - 1h, t), so point-in-time joins never leak);
- site_conditions: per site, every midnight, the mean of the previous day;
- maintenance_events: inspections at random times with the load and speed the
  machine ran at and the fault the technician found (the labels).

Each fault moves its own sensors: a worn bearing raises vibration and
temperature and grows with the hours since service; overheating raises the
temperatures and the current; an imbalance raises vibration in proportion to
the square of the speed and lowers the pressure. `drifted=True` moves the
inputs (hotter and more humid sites, a rougher and more loaded fleet) without
changing what a fault looks like, which is what the drift monitor must notice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd

FAULTS = ("none", "bearing", "overheating", "imbalance")
SITES = ("plant-north", "plant-south", "plant-east", "plant-west", "plant-coast")
SITE_AMBIENT = np.array([12.0, 24.0, 17.0, 15.0, 21.0])
SITE_HUMIDITY = np.array([55.0, 35.0, 60.0, 50.0, 78.0])
ONSET_PER_HOUR = np.array([0.0, 0.0040, 0.0040, 0.0035])
"""Base hourly chance that a healthy machine develops each fault."""
MEAN_FAULT_HOURS = 60.0
"""A fault lasts until a service, on average two and a half days."""
MEAN_SERVICE_INTERVAL = 240.0
"""Routine services come every ten days on average, faulty or not: the hours
since service stay stationary instead of growing through a period."""
WARMUP_HOURS = 480
TABLES = ("machine_telemetry", "site_conditions", "maintenance_events")
SEED = 17


@dataclass(frozen=True)
class Period:
    """What to simulate: days of fleet life from start, a whole UTC day."""

    start: datetime
    days: int = 30
    machines: int = 100
    events_per_machine_day: float = 4.0
    drifted: bool = False
    seed: int = SEED

    def __post_init__(self) -> None:
        if self.start != day_floor(self.start):
            raise ValueError(f"Period.start must be a midnight UTC, not {self.start.isoformat()}")

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)


def day_floor(moment: datetime) -> datetime:
    """The midnight UTC at or before the moment."""
    moment = moment.astimezone(timezone.utc) if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def default_start(days: int, end_days_ago: int = 0, now: datetime | None = None) -> datetime:
    """The start of a period of `days` ending `end_days_ago` before today's
    midnight, so a freshly prepared store can be materialised up to now."""
    return day_floor(now or datetime.now(timezone.utc)) - timedelta(days=days + end_days_ago)


def simulate(p: Period) -> dict[str, pd.DataFrame]:
    """Every table of the period (pure: the same period gives the same rows).

    The random stream is seeded with the seed and the period's first day, so
    an appended period continues the world instead of repeating it.
    """
    rng = np.random.default_rng([p.seed, int(p.start.timestamp()) // 86400])
    fleet = _fleet(p, np.random.default_rng(p.seed))
    hours = p.days * 24
    ambient, humidity = _weather(p, rng)
    state, since_service = _states(p, fleet, rng, hours)
    load = np.clip(rng.normal(fleet["load"][:, None] + (12.0 if p.drifted else 0.0), 9.0, (p.machines, hours)),
                   20.0, 100.0)
    rpm = fleet["rpm"][:, None] * (0.6 + 0.4 * load / 100.0)
    hour_ambient = np.repeat(ambient[:, 1:][fleet["site"]], 24, axis=1)
    return {
        "machine_telemetry": _telemetry(p, fleet, rng, state, since_service, load, rpm, hour_ambient),
        "site_conditions": _site_conditions(p, ambient, humidity),
        "maintenance_events": _events(p, fleet, rng, state, load, rpm),
    }


def write(p: Period, data_dir: Path) -> dict[str, int]:
    """Write the three tables as parquet; returns their row counts."""
    data_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, frame in simulate(p).items():
        frame.to_parquet(data_dir / f"{name}.parquet", index=False)
        counts[name] = len(frame)
    return counts


def _fleet(p: Period, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fixed machine attributes (the same for every period of a seed)."""
    n = p.machines
    return {
        "id": np.arange(1, n + 1, dtype=np.int64),
        "site": rng.integers(0, len(SITES), n),
        "rpm": rng.choice([1500.0, 1800.0, 3000.0, 3600.0], n),
        "load": rng.uniform(45.0, 75.0, n),
        "vibration": rng.lognormal(np.log(1.2), 0.15, n),
        "pressure": rng.uniform(4.0, 8.0, n),
        "wear": rng.lognormal(0.0, 0.3, n),
    }


def _weather(p: Period, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Daily mean ambient temperature and humidity per site, [sites, days + 1]:
    the day before the period (its first midnight reports it), then its days."""
    days = p.days + 1
    # Weather swings from day to day but returns to the site's climate, so
    # any week of a period looks like the whole period (no drift by itself).
    shocks = rng.normal(0.0, 0.7, (len(SITES), days))
    swing = np.zeros_like(shocks)
    for day in range(days):
        swing[:, day] = 0.3 * swing[:, day - 1] + shocks[:, day] if day else shocks[:, day]
    ambient = SITE_AMBIENT[:, None] + swing + (8.0 if p.drifted else 0.0)
    humidity = np.clip(SITE_HUMIDITY[:, None] + rng.normal(0.0, 6.0, (len(SITES), days))
                       + (15.0 if p.drifted else 0.0), 5.0, 100.0)
    return ambient, humidity


def _states(p: Period, fleet: dict[str, np.ndarray], rng: np.random.Generator,
            hours: int) -> tuple[np.ndarray, np.ndarray]:
    """Hourly hidden state per machine and the hours since its last service.

    The fleet runs WARMUP_HOURS before the period, so its first hour already
    has the steady mix of faults and service ages of every later hour.
    """
    n = p.machines
    state = np.zeros((n, WARMUP_HOURS + hours), dtype=np.int64)
    since = np.zeros((n, WARMUP_HOURS + hours), dtype=np.float64)
    current = np.zeros(n, dtype=np.int64)
    age = rng.exponential(MEAN_SERVICE_INTERVAL / 2, n)
    for h in range(WARMUP_HOURS + hours):
        healthy = current == 0
        # Wear makes bearing faults likelier the longer a machine runs unserviced.
        hazard = ONSET_PER_HOUR[None, :] * np.stack(
            [np.zeros(n), fleet["wear"] * (0.4 + age / 400.0), np.ones(n), np.ones(n)], axis=1)
        onset = rng.random((n, 4)) < hazard
        first = np.where(onset.any(axis=1), onset.argmax(axis=1), 0)
        serviced = ((~healthy & (rng.random(n) < 1.0 / MEAN_FAULT_HOURS))
                    | (rng.random(n) < 1.0 / MEAN_SERVICE_INTERVAL))
        current = np.where(healthy, first, np.where(serviced, 0, current))
        age = np.where(serviced, 0.0, age + 1.0)
        state[:, h], since[:, h] = current, age
    return state[:, WARMUP_HOURS:], since[:, WARMUP_HOURS:]


def _telemetry(p: Period, fleet: dict[str, np.ndarray], rng: np.random.Generator, state: np.ndarray,
               since: np.ndarray, load: np.ndarray, rpm: np.ndarray, ambient: np.ndarray) -> pd.DataFrame:
    n, hours = state.shape
    bearing, overheating, imbalance = (state == 1), (state == 2), (state == 3)
    krpm = rpm / 1000.0
    rough = 1.4 if p.drifted else 1.0
    vibration = (fleet["vibration"][:, None] * rough * (0.8 + 0.1 * krpm) * np.where(bearing, 2.3, 1.0)
                 + np.where(imbalance, 0.32 * krpm ** 2, 0.0)) * rng.lognormal(0.0, 0.12, (n, hours))
    temperature = (ambient + 20.0 + 0.35 * load + np.where(bearing, 7.0, 0.0) + np.where(overheating, 19.0, 0.0)
                   + rng.normal(0.0, 2.5, (n, hours)))
    peak = temperature + rng.gamma(2.0, 1.5, (n, hours)) + np.where(overheating, 12.0, 0.0)
    pressure = fleet["pressure"][:, None] * np.where(imbalance, 0.88, 1.0) * rng.lognormal(0.0, 0.04, (n, hours))
    current = (6.0 + 0.22 * load) * np.where(overheating, 1.18, 1.0) * rng.lognormal(0.0, 0.05, (n, hours))
    snapshots = pd.Timestamp(p.start) + pd.to_timedelta(np.arange(1, hours + 1), unit="h")
    return pd.DataFrame({
        "machine_id": np.repeat(fleet["id"], hours),
        "vibration_rms": vibration.ravel().astype(np.float32),
        "temperature_mean": temperature.ravel().astype(np.float32),
        "temperature_max": peak.ravel().astype(np.float32),
        "pressure_mean": pressure.ravel().astype(np.float32),
        "current_mean": current.ravel().astype(np.float32),
        "hours_since_service": since.ravel().astype(np.int64),
        "event_timestamp": np.tile(snapshots, n),
    })


def _site_conditions(p: Period, ambient: np.ndarray, humidity: np.ndarray) -> pd.DataFrame:
    """Midnight snapshots from the period's start to its last day; each reports
    the day before it."""
    midnights = pd.Timestamp(p.start) + pd.to_timedelta(np.arange(p.days), unit="D")
    return pd.DataFrame({
        "site_id": np.repeat(np.array(SITES), p.days),
        "ambient_temperature": ambient[:, :-1].ravel().astype(np.float32),
        "humidity": humidity[:, :-1].ravel().astype(np.float32),
        "event_timestamp": np.tile(midnights, len(SITES)),
    })


def _events(p: Period, fleet: dict[str, np.ndarray], rng: np.random.Generator, state: np.ndarray,
            load: np.ndarray, rpm: np.ndarray) -> pd.DataFrame:
    """Inspections from the end of the first hour (when the first telemetry
    snapshot exists) to the period's end, with what the technician found."""
    n, hours = state.shape
    count = int(p.machines * p.days * p.events_per_machine_day)
    machine = rng.integers(0, n, count)
    seconds = np.sort(rng.integers(3600, hours * 3600, count))
    hour = (seconds // 3600).astype(np.int64)
    return pd.DataFrame({
        "machine_id": fleet["id"][machine],
        "site_id": np.array(SITES)[fleet["site"][machine]],
        "load_pct": np.round(np.clip(load[machine, hour] + rng.normal(0.0, 2.0, count), 1.0, 100.0), 1),
        "rpm": np.round(rpm[machine, hour] * rng.lognormal(0.0, 0.01, count)).astype(np.int64),
        "fault_type": np.array(FAULTS)[state[machine, hour]],
        "event_timestamp": pd.Timestamp(p.start) + pd.to_timedelta(seconds, unit="s"),
    })
