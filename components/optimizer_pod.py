"""The optimisation pipeline in one Pod (a trainer backend's optimisation Job).

    python -m kubeloop.components.optimizer_pod

The same three steps the local and kfp backends run, in order, on the Pod's
scratch folder: the source model and its training data rebuilt from the
store its version recorded, every variant built and measured on the Pod's
own CPU or GPU, the winner registered. Nothing is kept between attempts: a
Pod the Job starts again measures again, and registration finds the version
an earlier attempt registered instead of a second.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from kubeloop.components.optimize import optimization_data_step, optimize_step, register_optimized_step
from kubeloop.components.trainer_run import OptimizationRun

log = logging.getLogger("kubeloop.components.optimizer_pod")


def readable_store(run: OptimizationRun) -> None:
    """Refuse, before any work, a source whose store is a folder on some
    other machine (a version trained on the local backend): a Pod reads only
    a published store, whose feature_store.yaml the version carries."""
    from mlflow import MlflowClient

    from kubeloop.api.optimization import OptimizedModelSpec
    from kubeloop.featurestore.store import StoreLocation
    from kubeloop.registry import tags

    source = OptimizedModelSpec.from_json(run.spec).source
    recorded = MlflowClient(run.tracking_uri).get_model_version(source.name, run.source_version).tags
    store = recorded.get(tags.FEATURE_STORE)
    folder = StoreLocation.from_json(store).path if store else None
    if folder is not None:
        raise SystemExit(
            f"{source.name} version {run.source_version} was trained on the store folder "
            f"{folder} of the machine that trained it, which this Pod cannot read: "
            "optimise it with spec.backend: local, or train it from a published store "
            "(spec.features.store.configMap) first")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run = OptimizationRun.from_environment()
    readable_store(run)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        dataset, source, work = (str(folder / name) for name in ("dataset.parquet", "source", "variants"))
        log.info("source %s and its training data", run.source_version)
        info = optimization_data_step(run.spec, run.source_version, run.tracking_uri, "", dataset, source)
        log.info("building and measuring the variants")
        results = optimize_step(run.spec, info, dataset, source, run.tracking_uri, run.source_version,
                                run.pipeline_run, run.owner, work, run.git_sha)
        registered = register_optimized_step(run.spec, run.source_version, results, work, run.tracking_uri,
                                             run.pipeline_run, run.owner)
    log.info("registered %s", json.dumps(registered["model"]))


if __name__ == "__main__":
    main()
