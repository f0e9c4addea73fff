"""The dataset initializer of a trainer backend run (Kubeflow Trainer runs it
before any node starts): the training pipeline's data steps in one Pod.

    python -m kubeloop.components.initializer

Feast's point-in-time join on the job's published store (its
feature_store.yaml from the ConfigMap the job names, in STORE_ENV; its
registry and sources in object storage), then data validation; the dataset,
its description and the validation report go to $STORAGE_URI, where Trainer
puts the TrainJob's initializer.dataset.storageUri and the nodes read them.
A finding in fail mode, or no store to join from, ends the Pod with
DATA_WRONG_EXIT and its reason as the last line it logs (the TrainJob then
fails at once, naming the column); anything else is tried again.
An initializer started again (its JobSet restarted for a lost node) finds
the run's data prepared and keeps it: the nodes resume from checkpoints of
a model trained on exactly that data. So does one whose pipeline prepared
the data before creating the TrainJob (the kfp backend's multi-node step).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

from kubeloop.components.objects import download, upload
from kubeloop.components.steps import training_data_step, validate_step
from kubeloop.components.trainer_run import DATA_WRONG_EXIT, DATASET, INFO, NO_STORE, STORE_ENV, VALIDATION, TrainerRun
from kubeloop.components.validation import DataValidationError

log = logging.getLogger("kubeloop.components.initializer")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        prepare(TrainerRun.from_environment())
    except (DataValidationError, NoStore) as exc:
        print(exc, file=sys.stderr)
        sys.exit(DATA_WRONG_EXIT)


class NoStore(ValueError):
    """The job names no published store, so there are no features to join."""


def prepare(run: TrainerRun) -> None:
    """The run's dataset, description and validation report below $STORAGE_URI, unless already there."""
    from kubeloop.featurestore.store import StoreLocation

    target = os.environ.get("STORAGE_URI", run.data).rstrip("/")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if download(f"{target}/{INFO}", folder / INFO, missing_ok=True):
            log.info("the run's data is already at %s (prepared by its pipeline, or before this JobSet "
                     "restarted): kept", target)
            return
        store = os.environ.get(STORE_ENV, "")
        if not store:
            raise NoStore(NO_STORE)
        dataset = folder / DATASET
        info = training_data_step(run.spec, StoreLocation(config=store).to_json(), "", str(dataset))
        report = validate_step(run.spec, str(dataset), info, run.tracking_uri, run.pipeline_run, run.owner)
        publish_data(folder, dataset, info, report, target)
    log.info("dataset written to %s", target)


def publish_data(folder: Path, dataset: Path, info: str, report: str, target: str) -> None:
    """The dataset, its validation report and its description below target;
    the description last: a node that finds it finds the dataset it describes."""
    (folder / INFO).write_text(info)
    (folder / VALIDATION).write_text(report)
    upload(dataset, f"{target}/{DATASET}")
    for name in (VALIDATION, INFO):
        upload(folder / name, f"{target}/{name}")


if __name__ == "__main__":
    main()
