"""The registry tags kubeloop writes on runs and model versions: the contract
between the pipelines that register models and the operator that reads them."""

PIPELINE_RUN = "kubeloop.pipeline_run"
"""The pipeline run that registered the version (makes registration idempotent)."""
TRAINJOB = "kubeloop.trainjob"
"""namespace/name of the Kubeflow Trainer TrainJob that trained the version (the trainer backend)."""
OWNER = "kubeloop.owner"
"""namespace/name of the TrainingJob or OptimizedModel behind the version."""
SOURCE = "kubeloop.source"
"""name/version of the version an optimised version was made from (its
lineage): an OptimizedModel whose source alias points at a version it
registered itself optimises that version's source, never the version."""
TECHNIQUE = "kubeloop.technique"
"""The optimiser's technique behind an optimised version (and each variant's run)."""
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
SELECTION = "kubeloop.selection"
"""Why an optimisation chose its winner, with the latency intervals (words)."""
SPEEDUP_INTERVAL = "kubeloop.speedup_interval"
"""The winner's speedup interval over the source, "low..high"."""
MEETS_SLO = "kubeloop.meets_slo"
"""true or false: whether the optimised version met its latency SLO."""
AUDIT = "kubeloop.audit"
"""On the registered model: promotions and rollbacks, newest last (JSON)."""
TASK = "kubeloop.task"
"""binary, multiclass or regression: what the model predicts."""
FEATURE_STORE = "kubeloop.feature_store"
"""The feature store the version's data came from (StoreLocation JSON): the
optimiser and the drift job rebuild its training data from there."""
FACTORY = "kubeloop.factory"
"""The PyTorch module factory that built the network (package.module:function)."""
REFERENCE = "kubeloop.reference"
"""runs:/ URI of the features the version learned from (Parquet, the
training split's input columns, at most REFERENCE_ROWS rows): the drift job's
reference, read from the registry wherever the job runs (a Pod on a cluster
has no feature store folder)."""
REFERENCE_ROWS = 50_000
VALIDATION = "kubeloop.validation"
"""On the training run and the version: what the data validation step found
(passed, warn: N findings: ..., or not configured); the whole report is the
run's validation/report.json."""
DATA_SCHEMA = "kubeloop.data_schema"
"""runs:/ URI of the schema inferred from the version's training data
(validation/data_schema.json): a later job's baseline when this version is
its champion."""
VIEW_HASHES = "kubeloop.view_hashes"
"""Feature view name (and "(labels)") -> a content hash of the values it gave
the training rows (JSON): `kubeloop reproduce` names the view whose data
changed when the rebuilt data set's hash differs."""
FACTORY_CODE = "kubeloop.factory_code"
"""A hash of the source file of the factory's module, so a reproduction can
say the network's code changed even where the git sha cannot (a user's package)."""
OPTIMIZATION_SPEC = "kubeloop.optimization_spec"
"""On an optimised version: the OptimizedModel spec (JSON) that made it."""
REPRODUCES = "kubeloop.reproduces"
"""On a run `kubeloop reproduce` made: name/version of the version it rebuilt
(such a run is never registered nor promoted)."""
