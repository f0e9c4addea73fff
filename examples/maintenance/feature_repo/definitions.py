"""The maintenance team's Feast repository: machines and sites, their hourly
telemetry and daily site conditions, the request's load and speed, and the
log of inspections whose findings are the labels.

Source paths are absolute, built from this file's folder: kubeloop opens the
store from a feature_store.yaml held in a ConfigMap, away from the
repository, so a relative path would resolve against the wrong folder.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pandas as pd
from feast import Entity, FeatureView, Field, FileSource, RequestSource, ValueType
from feast.on_demand_feature_view import on_demand_feature_view
from feast.types import Float32, Float64, Int64

DATA = Path(__file__).resolve().parent / "data"

machine = Entity(name="machine", join_keys=["machine_id"], value_type=ValueType.INT64,
                 description="A rotating machine (pump, fan or compressor) with its own sensors.")
site = Entity(name="site", join_keys=["site_id"], value_type=ValueType.STRING,
              description="The plant a machine stands in.")


def _source(name: str, table: str) -> FileSource:
    return FileSource(name=name, path=str(DATA / f"{table}.parquet"), timestamp_field="event_timestamp")


maintenance_events = _source("maintenance_events", "maintenance_events")
"""Inspections, the labelled entity rows: machine_id, site_id, the load_pct
and rpm the machine ran at, the fault_type found (none, bearing, overheating,
imbalance) at event_timestamp."""

machine_telemetry = FeatureView(
    name="machine_telemetry",
    entities=[machine],
    # Snapshots come every hour; one older than six hours means the sensors
    # went silent and their last reading no longer describes the machine.
    ttl=timedelta(hours=6),
    schema=[
        Field(name="vibration_rms", dtype=Float32),
        Field(name="temperature_mean", dtype=Float32),
        Field(name="temperature_max", dtype=Float32),
        Field(name="pressure_mean", dtype=Float32),
        Field(name="current_mean", dtype=Float32),
        Field(name="hours_since_service", dtype=Int64),
    ],
    source=_source("machine_telemetry_hourly", "machine_telemetry"),
    description="Sensor statistics over the past hour, per machine.",
    tags={"owner": "maintenance-team", "cadence": "hourly"},
)

site_conditions = FeatureView(
    name="site_conditions",
    entities=[site],
    ttl=timedelta(days=2),
    schema=[
        Field(name="ambient_temperature", dtype=Float32),
        Field(name="humidity", dtype=Float32),
    ],
    source=_source("site_conditions_daily", "site_conditions"),
    description="The previous day's mean ambient temperature and humidity, per site, published at midnight.",
    tags={"owner": "maintenance-team", "cadence": "daily"},
)

maintenance_request = RequestSource(
    name="maintenance_request",
    schema=[Field(name="load_pct", dtype=Float64), Field(name="rpm", dtype=Int64)],
    description="What the machine reports with the request: its load and shaft speed now.",
)


@on_demand_feature_view(
    sources=[machine_telemetry, site_conditions, maintenance_request],
    schema=[
        Field(name="temperature_per_load", dtype=Float64),
        Field(name="vibration_per_krpm", dtype=Float64),
        Field(name="temperature_above_ambient", dtype=Float64),
    ],
    mode="pandas",
    description="Readings set against the load, speed and weather they were taken in.",
)
def operating_context(inputs: pd.DataFrame) -> pd.DataFrame:
    # Self-contained on purpose: a process that never imported this file runs
    # the source Feast keeps in the registry, with only pd and np in scope.
    out = pd.DataFrame(index=inputs.index)
    temperature = inputs["temperature_mean"].astype("float64")
    out["temperature_per_load"] = temperature / inputs["load_pct"].astype("float64").clip(lower=1.0)
    out["vibration_per_krpm"] = (inputs["vibration_rms"].astype("float64")
                                 / (inputs["rpm"].astype("float64").clip(lower=1.0) / 1000.0))
    out["temperature_above_ambient"] = temperature - inputs["ambient_temperature"].astype("float64")
    return out


ENTITIES = [machine, site]
DATA_SOURCES = [maintenance_events]
FEATURE_VIEWS = [machine_telemetry, site_conditions]
ON_DEMAND_FEATURE_VIEWS = [operating_context]
