"""`kubeloop rollout pause|resume|promote|abort NAME`: a person's word on an
InferenceService's rollout in progress. Each writes the annotation a
kubectl user would (signals.kubeloop.dev/rollout), which the operator acts
on once per value, and shows the rollout's status."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="Pause, resume, promote or abort a rollout.")

Namespace = Annotated[str, typer.Option("--namespace", "-n", help="The InferenceService's namespace.")]


def _say(action: str, name: str, namespace: str) -> None:
    from kubeloop.api.constants import ANNOTATION_ROLLOUT
    from kubeloop.api.resources import INFERENCE_SERVICE
    from kubeloop.kube import Kube, KubeError

    kube = Kube.from_kubeconfig()
    try:
        obj = kube.merge_patch(INFERENCE_SERVICE.api_version, INFERENCE_SERVICE.kind, name,
                               {"metadata": {"annotations": {ANNOTATION_ROLLOUT: action}}}, namespace)
    except KubeError as exc:
        raise typer.BadParameter(f"InferenceService {namespace}/{name}: {exc}", param_hint="NAME") from None
    rollout = (obj.get("status") or {}).get("rollout")
    if not rollout:
        typer.echo(f"{namespace}/{name}: {action} recorded; no rollout is in progress yet")
        return
    typer.echo(f"{namespace}/{name}: {action} recorded; rollout of version {rollout['challenger']} is "
               f"{rollout.get('phase')} at step {rollout.get('step', 0) + 1} ({rollout.get('weight', 0)}%)")


@app.command()
def pause(name: str, namespace: Namespace = "default") -> None:
    """Hold the challenger at its current share; no analysis runs meanwhile."""
    _say("pause", name, namespace)


@app.command()
def resume(name: str, namespace: Namespace = "default") -> None:
    """Go on from the current step, whose time starts again."""
    _say("resume", name, namespace)


@app.command()
def promote(name: str, namespace: Namespace = "default") -> None:
    """Give the challenger all traffic and move the alias now."""
    _say("promote", name, namespace)


@app.command()
def abort(name: str, namespace: Namespace = "default") -> None:
    """Send all traffic back to the champion; the alias is not moved."""
    _say("abort", name, namespace)
