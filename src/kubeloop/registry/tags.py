"""The registry tags kubeloop writes on runs and model versions: the contract
between the pipelines that register models and the operator that reads them."""

PIPELINE_RUN = "kubeloop.pipeline_run"
"""The pipeline run that registered the version (makes registration idempotent)."""
OWNER = "kubeloop.owner"
"""namespace/name of the TrainingJob or OptimizedModel behind the version."""
TRAINING_SPEC = "kubeloop.training_spec"
"""The TrainingJob spec (JSON) whose data and features the model expects."""
GPU_MEMORY_MIB = "kubeloop.gpu_memory_mib"
"""The model's GPU memory footprint; the placement planner reads it."""
GPU_MEMORY_SOURCE = "kubeloop.gpu_memory_source"
"""measured (on a GPU) or estimate (from weights and activations)."""
OUTCOME = "kubeloop.outcome"
"""An optimisation's variants table, choice and batching (JSON)."""
METRIC_PREFIX = "metric."
"""metric.<name>: the version's hold-out metrics (what metric gates read)."""
CHAMPION_PREFIX = "gate.champion."
"""gate.champion.<name>: the champion's metrics on this version's hold-out."""
AUDIT_PREFIX = "kubeloop.audit."
"""On the registered model: one tag per promotion, rejection or rollback
(kubeloop.audit.<ns since the epoch>-<random>, JSON), so the trail is
append-only. AUDIT below is the single list tag of earlier versions, still
read for the entries it holds."""
MEETS_SLO = "kubeloop.meets_slo"
"""true or false: whether the optimised version met its latency SLO."""
AUDIT = "kubeloop.audit"
"""On the registered model: promotions and rollbacks, newest last (JSON)."""
