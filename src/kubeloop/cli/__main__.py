"""`python -m kubeloop.cli`, the same as the kubeloop script."""

from kubeloop.cli.main import app

app()
