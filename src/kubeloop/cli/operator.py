"""`kubeloop operator`: run the operator."""

from __future__ import annotations

import logging
from typing import Annotated, Optional

import typer


def run(
    namespace: Annotated[Optional[list[str]], typer.Option(
        "--namespace", "-n", help="Watch only these namespaces (repeatable); default: the whole cluster, "
        "or KUBELOOP_NAMESPACES.")] = None,
    liveness: Annotated[Optional[str], typer.Option(
        help="Serve kopf's liveness probe at this URL, e.g. http://0.0.0.0:8080/healthz.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run the kubeloop operator against the current kubeconfig (or in-cluster).

    Configuration comes from the environment (see README, "Operator
    configuration"): MLFLOW_TRACKING_URI, KUBELOOP_PIPELINE_BACKEND,
    KUBELOOP_SERVING_BACKEND, KUBELOOP_KFP_ENDPOINT, KUBELOOP_FEAST_REPO, ...
    """
    import kopf

    from kubeloop.operator.handlers import build_registry
    from kubeloop.operator.settings import ConfigurationError, OperatorConfig
    from kubeloop.operator.wiring import build_ports

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    memo = kopf.Memo()
    try:
        config = OperatorConfig.from_env()
        memo.ports = build_ports(config)
    except ConfigurationError as exc:
        # One line naming the setting, not a traceback.
        typer.echo(f"kubeloop operator: configuration error: {exc}", err=True)
        raise typer.Exit(2) from None
    namespaces = list(namespace or config.namespaces)
    kopf.run(
        registry=build_registry(config),
        memo=memo,
        standalone=True,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=liveness,
    )
