"""Names shared by the API, the operator and the chart."""

GROUP = "kubeloop.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "kubeloop"

# Annotations and labels the operator owns. kopf's own bookkeeping is moved
# under the same group (see kubeloop.operator.handlers.configure).
FINALIZER = f"{GROUP}/finalizer"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "kubeloop"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_OWNER_KIND = f"{GROUP}/owner-kind"
LABEL_OWNER_NAME = f"{GROUP}/owner-name"
LABEL_ROLE = f"{GROUP}/role"
# On a TrainingJob that retraining started: the InferenceService it retrains.
LABEL_RETRAIN_OF = f"{GROUP}/retrain-of"
ANNOTATION_INPUT_HASH = f"{GROUP}/input-hash"
# What webhooks record on objects. Not under GROUP/: kopf keeps its own
# bookkeeping there and ignores those annotations when it looks for changes.
SIGNALS = f"signals.{GROUP}"
ANNOTATION_DRIFT_ALERT = f"{SIGNALS}/drift-alert"
ANNOTATION_REGISTRY_EVENT = f"{SIGNALS}/registry-event"
# A person's word on the rollout in progress: pause, resume, promote or abort.
ANNOTATION_ROLLOUT = f"{SIGNALS}/rollout"

# Here rather than with the Triton config that enforces it: the serving front
# bounds requests by it too, and the front imports nothing of the steps.
MAX_REQUEST_ROWS = 1024
"""The most rows one request may carry to a batching model. Triton refuses a
request of more rows than max_batch_size, so max_batch_size bounds callers;
the preferred batch sizes (not max_batch_size) steer what the dynamic
batcher waits to gather."""
