"""Prepare the maintenance team's feature store, as the team itself would:
write the data, fill in feature_store.yaml, apply the definitions and
materialise through Feast's Python API, and write the ConfigMap that tells
kubeloop where the store is. kubeloop never applies anything to a user's
repository; it only reads the store this leaves behind.

    python examples/maintenance/prepare.py DIR [--days 30] [--end-days-ago 0] [--drifted]
    python examples/maintenance/prepare.py DIR --append --days 7 [--drifted]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template

import pandas as pd
import yaml

if not __package__:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.maintenance.generate import SEED, TABLES, Period, default_start, write  # noqa: E402

FEATURE_REPO = Path(__file__).resolve().with_name("feature_repo")
CONFIGMAP_NAME = "maintenance-feature-store"
CONFIGMAP_KEY = "feature_store.yaml"
CONFIGMAP_FILE = "feature-store-configmap.yaml"
FEATURE_VIEWS = ("machine_telemetry", "site_conditions", "operating_context")
LABEL_SOURCE, LABEL_COLUMN = "maintenance_events", "fault_type"


@dataclass(frozen=True)
class Prepared:
    """A prepared repository and what went into it."""

    repo: Path
    period: Period
    counts: dict[str, int]
    """Rows written per table by this period."""

    @property
    def config(self) -> str:
        """The feature_store.yaml text, with absolute paths."""
        return (self.repo / "feature_store.yaml").read_text()

    @property
    def configmap(self) -> Path:
        return self.repo / CONFIGMAP_FILE


def prepare(directory: Path, period: Period | None = None) -> Prepared:
    """A complete feature repository in directory: data, config, registry,
    online store and the ConfigMap manifest."""
    repo = directory.resolve()
    period = period or Period(start=default_start(30))
    repo.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FEATURE_REPO / "definitions.py", repo / "definitions.py")
    (repo / "feature_store.yaml").write_text(fill_config(repo))
    counts = write(period, repo / "data")
    apply(repo)
    materialize(repo, period)
    write_configmap(repo)
    return Prepared(repo=repo, period=period, counts=counts)


def fill_config(repo: Path) -> str:
    """The template's feature_store.yaml with the repository's absolute path."""
    return Template((FEATURE_REPO / "feature_store.yaml").read_text()).substitute(repo_dir=str(repo))


def apply(repo: Path) -> list[str]:
    """Register the repository's definitions.py in its registry (what
    `feast apply` does, through the Python API)."""
    from feast import FeatureStore

    definitions = _load_definitions(repo / "definitions.py")
    objects = [*definitions.ENTITIES, *definitions.DATA_SOURCES, *definitions.FEATURE_VIEWS,
               *definitions.ON_DEMAND_FEATURE_VIEWS]
    FeatureStore(repo_path=str(repo)).apply(objects)
    return [o.name for o in objects]


def materialize(repo: Path, period: Period) -> None:
    """Load the period's latest feature values into the online store."""
    from feast import FeatureStore

    FeatureStore(repo_path=str(repo)).materialize(start_date=period.start, end_date=period.end)


def append_period(repo: Path, days: int = 7, drifted: bool = True, seed: int = SEED) -> Prepared:
    """Add `days` of newer data (drifted by default) after the repository's
    last day, and materialise it. Same machines and sites, a new stretch of
    their lives; returns the rows added per table."""
    repo = repo.resolve()
    data = repo / "data"
    end = pd.read_parquet(data / "machine_telemetry.parquet", columns=["event_timestamp"])["event_timestamp"].max()
    period = Period(start=end.to_pydatetime(), days=days, drifted=drifted, seed=seed)
    staging = data / ".incoming"
    counts = write(period, staging)
    for name in TABLES:
        combined = pd.concat([pd.read_parquet(data / f"{name}.parquet"), pd.read_parquet(staging / f"{name}.parquet")],
                             ignore_index=True)
        combined.to_parquet(data / f"{name}.parquet", index=False)
    shutil.rmtree(staging)
    materialize(repo, period)
    return Prepared(repo=repo, period=period, counts=counts)


def configmap(repo: Path) -> dict:
    """The ConfigMap a TrainingJob names in spec.features.store.configMap."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_NAME, "labels": {"app.kubernetes.io/part-of": "maintenance"}},
            "data": {CONFIGMAP_KEY: fill_config(repo)}}


def write_configmap(repo: Path) -> Path:
    path = repo / CONFIGMAP_FILE
    path.write_text(yaml.dump(configmap(repo), Dumper=_LiteralDumper, sort_keys=False))
    return path


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so the embedded yaml stays readable."""


_LiteralDumper.add_representer(
    str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _load_definitions(path: Path):  # noqa: ANN202 - a module
    """Import the repository's definitions.py by path, as `feast apply` does:
    it is the repository's file, not a module of any installed package."""
    spec = importlib.util.spec_from_file_location("maintenance_feature_definitions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where the repository goes (created if missing)")
    parser.add_argument("--days", type=int, default=None, help="days of data (default 30; 7 with --append)")
    parser.add_argument("--end-days-ago", type=int, default=0,
                        help="end the data this many days before today (room for a later --append)")
    parser.add_argument("--drifted", action="store_true", help="hotter, more humid sites and a rougher fleet")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--append", action="store_true", help="add a newer period to a prepared repository")
    args = parser.parse_args(argv)
    os.environ.setdefault("FEAST_USAGE", "False")
    if args.append:
        done = append_period(args.directory, days=args.days or 7, drifted=args.drifted, seed=args.seed)
    else:
        days = args.days or 30
        done = prepare(args.directory, Period(start=default_start(days, args.end_days_ago), days=days,
                                              drifted=args.drifted, seed=args.seed))
    rows = ", ".join(f"{n} {name}" for name, n in done.counts.items())
    print(f"{done.repo}: {done.period.start:%Y-%m-%d} to {done.period.end:%Y-%m-%d}"
          f"{' (drifted)' if done.period.drifted else ''}: {rows}")
    print(f"kubectl apply -f {done.configmap}")


if __name__ == "__main__":
    main()
