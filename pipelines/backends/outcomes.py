"""What a finished pipeline run produced, read back from the registry: the
register step tags every version with its pipeline run's name."""

from __future__ import annotations

import json

from mlflow import MlflowClient

from kubeloop.registry import tags
from kubeloop.registry.mlflow import run_url


def mlflow_outcomes(tracking_uri: str):  # noqa: ANN201 - an OutcomeReader
    client = MlflowClient(tracking_uri)

    def read(run_name: str) -> dict:
        versions = client.search_model_versions(f"tags.`{tags.PIPELINE_RUN}` = '{run_name}'")
        if not versions:
            return {}
        version = versions[0]
        run = client.get_run(version.run_id)
        metrics = {k.removeprefix("holdout."): v for k, v in run.data.metrics.items() if k.startswith("holdout.")}
        outputs = {"model": {"name": version.name, "version": str(version.version),
                             "uri": f"models:/{version.name}/{version.version}",
                             "run_url": run_url(tracking_uri, version.run_id)},
                   "metrics": {k: v for k, v in metrics.items() if k not in ("rows", "positives")}}
        if tags.OUTCOME in version.tags:
            outputs.update(json.loads(version.tags[tags.OUTCOME]))
        return outputs

    return read
