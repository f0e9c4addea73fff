"""TrainingJob: train a model on Feast features through a Kubeflow pipeline and
register it in the model registry."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from kubeloop.api.base import BaseStatus, KubeModel, RegisteredModel
from kubeloop.api.gpu import GPURequest
from kubeloop.api.promotion import PromotionPolicy
from kubeloop.api.schema import cel, cel_list
from kubeloop.api.tasks import PRIMARY, Task, cel_metric_rule

TrainingPhase = Literal["Pending", "Running", "Succeeded", "Failed"]
PipelineBackendName = Literal["local", "kfp", "trainer", "noop"]


class LabelSource(KubeModel):
    """Where the labelled entity rows come from: a data source of the feature
    store, or a file. Besides the label they hold the event time, the entity
    join keys of the feature views and the request columns of the on-demand
    views."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("has(self.source) != has(self.path)", "give either source (a data source of the feature store) "
             "or path (a Parquet file), not both", "source"),
            ("!has(self.path) || has(self.timestampColumn)", "timestampColumn is required with path",
             "timestampColumn"),
        )
    )

    source: str | None = Field(default=None, min_length=1, max_length=128)
    """A file data source of the feature store whose rows are the entity rows of
    the point-in-time join (for example transactions)."""
    path: str | None = Field(default=None, min_length=1, max_length=1024)
    """Instead of source: a Parquet file (path or fsspec URL) of labelled rows,
    read where the pipeline runs."""
    column: str = Field(min_length=1, max_length=128)
    """The label column: 0/1 for binary, class values for multiclass, numbers
    for regression."""
    timestamp_column: str | None = Field(default=None, min_length=1, max_length=128)
    """The event-time column; omitted means the data source's timestamp field."""


class ConfigMapKey(KubeModel):
    """A key of a ConfigMap in the object's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """The ConfigMap's name."""
    key: str = Field(default="feature_store.yaml", min_length=1, max_length=253)
    """The key that holds the file."""


class FeatureStoreRef(KubeModel):
    """A Feast feature store, as Feast's operator publishes it to clients."""

    config_map: ConfigMapKey
    """A ConfigMap holding the store's feature_store.yaml (for example the client
    ConfigMap of a Feast FeatureStore). Its paths, and those of the file data
    sources in its registry, must be absolute, or its stores remote: the file
    is read where the pipeline runs, far from the repository."""


class TimeWindow(KubeModel):
    """A half-open interval of event timestamps."""

    start: str | None = Field(default=None, max_length=64)
    """First event time included (RFC 3339); omitted means the oldest row."""
    end: str | None = Field(default=None, max_length=64)
    """First event time excluded (RFC 3339); omitted means up to now."""


class FeatureSelection(KubeModel):
    """The training data: Feast feature views joined point-in-time onto labelled
    entity rows."""

    store: FeatureStoreRef | None = None
    """The feature store to read; omitted means the operator's default store
    (KUBELOOP_FEAST_REPO). kubeloop only reads it: nothing is applied to it."""
    feature_views: list[str] = Field(min_length=1, max_length=32)
    """Feature views (or on-demand feature views) whose features the model uses,
    for example [card_stats, merchant_risk]."""
    labels: LabelSource
    """The entity rows and the label."""
    window: TimeWindow = Field(default_factory=TimeWindow)
    """Which entity rows to train and evaluate on, by event time."""


class Hyperparameters(KubeModel):
    """Optimiser and network settings of the torch trainer."""

    epochs: int = Field(default=5, ge=1, le=1000)
    """Passes over the training split."""
    batch_size: int = Field(default=256, ge=1, le=65536)
    """Examples per optimiser step and process (before gradient accumulation)."""
    learning_rate: float = Field(default=1e-3, gt=0, le=10)
    """AdamW learning rate."""
    weight_decay: float = Field(default=1e-4, ge=0, le=1)
    """AdamW weight decay."""
    hidden_units: list[int] = Field(default_factory=lambda: [64, 32], min_length=1, max_length=8)
    """Widths of the hidden layers of the built-in multi-layer perceptron (not
    used with spec.model)."""
    dropout: float = Field(default=0.1, ge=0, lt=1)
    """Dropout probability after each hidden layer of the built-in perceptron
    (not used with spec.model)."""
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=1024)
    """Micro-batches whose gradients are summed before one optimiser step."""
    activation_checkpointing: bool = False
    """Recompute hidden activations in the backward pass to save memory (the
    built-in perceptron; a user module applies it to each of its children)."""


class ModelFactory(KubeModel):
    """A PyTorch module of the user's, instead of the built-in perceptron."""

    factory: str = Field(min_length=3, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
    """package.module:function. kubeloop calls function(n_inputs, n_outputs,
    **parameters) and expects a torch.nn.Module that maps a standardised float
    batch [B, n_inputs] to raw scores [B, n_outputs] (logits for classification,
    a standardised value for regression); kubeloop adds the standardisation in
    front and the task's output (sigmoid, softmax, de-standardisation) behind."""
    path: str | None = Field(default=None, min_length=1, max_length=1024)
    """A folder to import the factory's package from (local backend: a folder on
    the operator's machine). Omitted means the package is installed in the
    components image."""
    parameters: dict[str, Any] = Field(default_factory=dict, max_length=64)
    """Keyword arguments for the factory (free-form; recorded with the model)."""


class DistributedTraining(KubeModel):
    """Data-parallel training (torch DistributedDataParallel through torchrun)."""

    nodes: int = Field(default=1, ge=1, le=64)
    """Machines (Pods) taking part; more than one needs a real cluster with the
    Kubeflow Trainer."""
    processes_per_node: int = Field(default=1, ge=1, le=16)
    """Worker processes per node; with GPUs, one per GPU."""


class SearchDimension(KubeModel):
    """One hyper-parameter the tuner varies: a range or a list of choices."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("has(self.choices) != (has(self.min) && has(self.max))",
             "give either choices or both min and max", "choices"),
            ("!has(self.min) || !has(self.max) || self.min < self.max",
             "min must be smaller than max", "min"),
        )
    )

    min: float | None = None
    """Lower bound of a continuous range."""
    max: float | None = None
    """Upper bound of a continuous range."""
    log: bool = False
    """Sample the range on a log scale (learning rates)."""
    choices: list[float] | None = Field(default=None, min_length=1, max_length=32)
    """Discrete values to choose from (layer widths, batch sizes)."""


# Hyper-parameters a tuning search may vary (the scalar ones).
TUNABLE = ("learningRate", "weightDecay", "dropout", "batchSize", "epochs", "gradientAccumulationSteps")


class Tuning(KubeModel):
    """Hyper-parameter search: each trial is a nested MLflow run; the best trial's
    model is the one registered."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            # has(): the API server also checks these rules against the {} default.
            (f"!has(self.parameters) || self.parameters.all(k, k in {cel_list(TUNABLE)})",
             f"tuning.parameters keys must be among {', '.join(TUNABLE)}", "parameters"),
            ("!has(self.algorithm) || self.algorithm != 'grid' || !has(self.parameters) || "
             "self.parameters.all(k, has(self.parameters[k].choices))",
             "algorithm grid needs choices (not ranges) for every parameter", "algorithm"),
        )
    )

    trials: int = Field(default=1, ge=1, le=200)
    """How many trials to run; 1 means no search."""
    algorithm: Literal["tpe", "random", "grid"] = "tpe"
    """Optuna's sampler: tpe (Bayesian), random, or grid over choices."""
    metric: str | None = Field(default=None, min_length=1, max_length=64)
    """The evaluation metric the search optimises (in its own direction), also
    what not-worse-than-champion compares; omitted means the task's primary
    metric (binary auc, multiclass macro_f1, regression rmse)."""
    parameters: dict[str, SearchDimension] = Field(default_factory=dict, max_length=16)
    """Hyper-parameters to vary, keyed by their field name in hyperparameters
    (learningRate, dropout, batchSize, weightDecay)."""


class Evaluation(KubeModel):
    """How the trained model is judged on held-out data."""

    holdout_fraction: float = Field(default=0.2, gt=0, lt=1)
    """The most recent fraction of entity rows, by event time, kept for evaluation."""
    threshold: float = Field(default=0.5, gt=0, lt=1)
    """Binary: score above which a row is predicted positive (for precision and recall)."""
    top_k: int = Field(default=3, ge=1, le=100)
    """Multiclass: k of top_k_accuracy (the true class among the k most likely)."""
    slice_column: str | None = Field(default=None, max_length=128)
    """A column whose values get metrics of their own: a column of the labelled
    rows (spec.features.labels) that is not a model input, such as a region or a
    sensitive attribute kept out of the model on purpose (carried beside the
    features for evaluation only), or a feature."""


class ColumnRule(KubeModel):
    """What one column of the training data must hold. Checked on every row
    (train and hold-out) after the point-in-time join, before training."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("has(self.maxNullShare) || has(self.min) || has(self.max) || has(self.categories)",
             "a rule needs at least one of maxNullShare, min, max or categories", "column"),
            ("!has(self.min) || !has(self.max) || self.min <= self.max", "min must not exceed max", "min"),
            ("!has(self.categories) || (!has(self.min) && !has(self.max))",
             "categories is for a categorical column: give it without min and max", "categories"),
        )
    )

    column: str = Field(min_length=1, max_length=128)
    """A column of the training data: a feature, the label or the slice column."""
    max_null_share: float | None = Field(default=None, ge=0, le=1)
    """The largest share of rows without a value (the feature store had none)."""
    min: float | None = None
    """The smallest value allowed (a numeric column)."""
    max: float | None = None
    """The largest value allowed (a numeric column)."""
    categories: list[str] | None = Field(default=None, min_length=1, max_length=256)
    """The values allowed (compared as text; a whole number as 3, not 3.0)."""


class ShareRange(KubeModel):
    """Bounds of a share, from 0 to 1."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("has(self.min) || has(self.max)", "give min, max or both", "min"),
            ("!has(self.min) || !has(self.max) || self.min <= self.max", "min must not exceed max", "min"),
        )
    )

    min: float | None = Field(default=None, ge=0, le=1)
    """The smallest share allowed."""
    max: float | None = Field(default=None, ge=0, le=1)
    """The largest share allowed."""


class ChampionComparison(KubeModel):
    """The training data compared with the data the champion learned from:
    the schema inferred from the champion's training run (kept with it as
    validation/data_schema.json) and its training sample (for PSI). The
    champion is the version at promotion.promoteTo (champion by default); a
    first run, with none, only records its own schema."""

    enabled: bool = True
    """Compare with the champion at all."""
    psi_threshold: float = Field(default=0.25, gt=0, le=100)
    """Population stability index per feature (Evidently's psi test) above
    which the feature's distribution has moved too far."""
    max_null_share_increase: float = Field(default=0.1, ge=0, le=1)
    """How much a column's share of rows without a value may rise above the champion's."""
    range_tolerance: float = Field(default=0.1, ge=0, le=100)
    """How far outside the champion's [min, max] a value may lie before it
    counts as out of range, as a fraction of that range's width."""
    max_out_of_range_share: float = Field(default=0.01, ge=0, le=1)
    """The share of a numeric column's values that may lie out of range."""
    max_unseen_category_share: float = Field(default=0.0, ge=0, le=1)
    """The share of a categorical column's rows whose value the champion
    never saw."""
    max_label_share_shift: float = Field(default=0.1, ge=0, le=1)
    """How far the share of each label value (binary: of positives) may move
    from the champion's (classification tasks)."""


class DataValidation(KubeModel):
    """Checks of the training data before training: the rules stated here and
    a comparison with the champion's training data. The report is logged to
    the training run (validation/report.json)."""

    mode: Literal["fail", "warn"] = "fail"
    """fail: a violation fails the run, its condition naming the column, the
    rule and the values. warn: the run goes on and the registered version
    records the findings (tag kubeloop.validation)."""
    rules: list[ColumnRule] = Field(default_factory=list, max_length=64)
    """Per-column rules."""
    label_share: ShareRange | None = None
    """Bounds of the label's share: binary, of positive rows; multiclass, of
    every class."""
    champion: ChampionComparison = Field(default_factory=ChampionComparison)
    """The comparison with the champion's training data."""


class TrainingResources(KubeModel):
    """What each training process needs."""

    cpu: int | str = Field(default="1")
    """CPU request per process, as a Kubernetes quantity."""
    memory: int | str = Field(default="2Gi")
    """Memory request per process, as a Kubernetes quantity."""
    gpu: GPURequest | None = None
    """GPUs per node; omitted trains on CPU."""


class TrainingJobSpec(KubeModel):
    """A model to train on Feast features and register."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("!has(self.resources.gpu) || self.resources.gpu.count == 0 || "
             "self.distributed.processesPerNode <= self.resources.gpu.count",
             "with GPUs, processesPerNode must not exceed resources.gpu.count (one process per GPU)",
             "distributed.processesPerNode"),
            ("self.tuning.trials == 1 || size(self.tuning.parameters) > 0",
             "tuning.trials > 1 needs at least one entry in tuning.parameters",
             "tuning.parameters"),
            ("!has(self.tuning.metric) || " + cel_metric_rule("self.task", "self.tuning.metric"),
             "tuning.metric is not a metric of this task (binary: auc, log_loss, f1, ...; multiclass: accuracy, "
             "macro_f1, log_loss, top_k_accuracy, recall.<class>; regression: rmse, mae, r2)", "tuning.metric"),
            ("!has(self.promotion) || !has(self.promotion.gates) || !has(self.promotion.gates.metrics) || "
             "self.promotion.gates.metrics.all(g, " + cel_metric_rule("self.task", "g.metric") + ")",
             "promotion.gates.metrics names a metric this task does not produce (binary: auc, log_loss, f1, ...; "
             "multiclass: accuracy, macro_f1, log_loss, top_k_accuracy, recall.<class>; regression: rmse, mae, "
             "r2)", "promotion.gates.metrics"),
            ("!has(self.validation) || !has(self.validation.labelShare) || self.task != 'regression'",
             "validation.labelShare needs a classification task (binary or multiclass)", "validation.labelShare"),
        )
    )

    model_name: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The registered model name the result is registered under, for example fraud-detector."""
    task: Task = "binary"
    """What the model predicts: binary (a probability; the default), multiclass
    (a probability per class) or regression (a value). It decides the loss,
    the output, the metrics and the direction of every metric gate."""
    model: ModelFactory | None = None
    """The user's own PyTorch module; omitted means the built-in perceptron
    (hyperparameters.hiddenUnits, dropout)."""
    backend: PipelineBackendName | None = None
    """Where the pipeline runs: local (kfp's local runner on the operator's
    machine), kfp (a Kubeflow Pipelines API server), trainer (one Kubeflow
    Trainer TrainJob on the cluster; needs spec.features.store) or noop (no
    training; for tests and benchmarks). Omitted means the operator's default."""
    features: FeatureSelection
    """The training data."""
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    """Trainer settings."""
    resources: TrainingResources = Field(default_factory=TrainingResources)
    """Compute per process."""
    distributed: DistributedTraining = Field(default_factory=DistributedTraining)
    """Data-parallel training settings."""
    tuning: Tuning = Field(default_factory=Tuning)
    """Hyper-parameter search."""
    evaluation: Evaluation = Field(default_factory=Evaluation)
    """Held-out evaluation."""
    seed: int = Field(default=42, ge=0, le=2**31 - 1)
    """Seed for data splits, initialisation and data order: the same spec and
    data give the same model."""
    promotion: PromotionPolicy | None = None
    """Aliases to give the registered version, and the gates it must pass first."""
    validation: DataValidation | None = None
    """Checks of the training data before training: rules and the comparison
    with the champion's training data. Omitted means no checks; the data's
    schema is still inferred and kept with the training run, as a later
    job's baseline."""


    @property
    def tuning_metric(self) -> str:
        """The metric tuning and the champion comparison use."""
        return self.tuning.metric or PRIMARY[self.task]


class TrainingJobStatus(BaseStatus):
    """What the operator observed of the training run."""

    phase: TrainingPhase = "Pending"
    """Pending, Running, Succeeded or Failed."""
    backend: PipelineBackendName | None = None
    """The backend the run was submitted to."""
    run_id: str | None = None
    """The pipeline run's id on its backend."""
    run_url: str | None = None
    """Where to watch the run (the KFP UI, or the local run's folder)."""
    spec_hash: str | None = None
    """Hash of the spec the run was submitted for; a new hash means a new run."""
    started_at: str | None = None
    """When the run was submitted (RFC 3339)."""
    completed_at: str | None = None
    """When the run finished (RFC 3339)."""
    metrics: dict[str, float] = Field(default_factory=dict, max_length=64)
    """Held-out evaluation metrics of the registered model."""
    model: RegisteredModel | None = None
    """The model version the run registered."""
