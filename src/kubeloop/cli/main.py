"""The kubeloop command line."""

from __future__ import annotations

import typer

from kubeloop.cli import api, demo, dev, operator, placement, registry, reproduce, rollout, serving
from kubeloop.featurestore import cli as features
from kubeloop.pipelines import cli as pipelines

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="kubeloop: train, optimise, serve and retrain models from Kubernetes resources.")
app.add_typer(dev.app, name="dev")
app.add_typer(features.app, name="features")
app.add_typer(pipelines.app, name="pipelines")
app.add_typer(serving.app, name="serving")
app.add_typer(placement.app, name="placement")
app.add_typer(rollout.app, name="rollout")
app.command("operator")(operator.run)
app.command("crds")(api.crds)
app.command("rbac")(api.rbac)
app.command("gpus")(api.gpus)
app.command("demo")(demo.demo)
app.command("promote")(registry.promote)
app.command("rollback")(registry.rollback)
app.command("audit")(registry.audit)
app.command("reproduce")(reproduce.reproduce)
