"""Pure functions that build the serving objects (Triton Deployments, Services,
the router, autoscalers, KServe InferenceServices): plain data in, plain dicts
out, no I/O (an import-linter contract keeps it so). The operator plans with
them and the serving backends apply them."""
