"""Where pipelines run: a Kubeflow Pipelines server, kfp's local runner, or nowhere."""
