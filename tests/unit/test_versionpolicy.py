"""A model's Triton config narrowed to the versions that can load
(kubeloop.front.versionpolicy). Unit, pure: Triton taking the narrowed
config as a load's override is tests/components/test_pool.py."""

from __future__ import annotations

import json

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from kubeloop.front.versionpolicy import config_without

CONFIG = """
name: "ml.fraud"
backend: "python"
max_batch_size: 64
version_policy { specific { versions: 1 versions: 3 versions: 4 } }
input { name: "features" data_type: TYPE_FP32 dims: 4 }
output { name: "probability" data_type: TYPE_FP32 dims: 1 }
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


def test_the_failed_versions_leave_the_policy_and_the_rest_of_the_config_stays():
    narrowed = config_without(CONFIG, {"3"})
    config = json_format.Parse(narrowed, mc.ModelConfig())
    assert list(config.version_policy.specific.versions) == [1, 4]
    assert config.name == "ml.fraud" and config.backend == "python" and config.max_batch_size == 64
    assert config.input[0].dims == [4] and config.dynamic_batching.max_queue_delay_microseconds == 500
    assert "max_batch_size" in json.loads(narrowed), "field names as in the proto, as Triton's override reads them"


def test_nothing_to_load_instead_when_every_version_failed_or_none_is_named():
    assert config_without(CONFIG, {"1", "3", "4"}) is None
    assert config_without(CONFIG.replace("specific { versions: 1 versions: 3 versions: 4 }", "latest { num_versions: 2 }"),
                          {"3"}) is None
