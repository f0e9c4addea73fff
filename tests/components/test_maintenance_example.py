"""The maintenance example's data and the user model modules, proved locally
with the real libraries (Feast, scikit-learn, torch, ONNX Runtime), no
cluster: the generator is deterministic, the prepared repository answers
point-in-time joins for every labelled row when opened from its ConfigMap's
feature_store.yaml alone, the features really determine the fault, a drifted
period moves the inputs, and both teams' factories build modules that train
and export to ONNX with a dynamic batch. What kubeloop does with them (the
operator, the pipeline, serving) is proved by the e2e tests, not here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from examples.maintenance import generate, prepare

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TELEMETRY = ["vibration_rms", "temperature_mean", "temperature_max", "pressure_mean", "current_mean",
             "hours_since_service"]
SITE = ["ambient_temperature", "humidity"]
CONTEXT = ["temperature_per_load", "vibration_per_krpm", "temperature_above_ambient"]
FEATURES = [*TELEMETRY, *SITE, *CONTEXT]
SMALL = {"days": 10, "machines": 60}
START = datetime(2026, 3, 2, tzinfo=timezone.utc)
"""A fixed first day: the generator seeds each period with its first day, so
a start that moved with the calendar would change the data every day."""


def open_from_configmap(repo: Path, scratch: Path):  # noqa: ANN201 - feast.FeatureStore
    """The store as a client holding only the ConfigMap sees it: the yaml text
    in a folder of its own, away from the repository and its definitions."""
    from feast import FeatureStore, RepoConfig

    manifest = yaml.safe_load((repo / prepare.CONFIGMAP_FILE).read_text())
    text = manifest["data"][prepare.CONFIGMAP_KEY]
    scratch.mkdir(parents=True, exist_ok=True)
    return FeatureStore(config=RepoConfig(repo_path=str(scratch), **yaml.safe_load(text)))


def join(store, start: pd.Timestamp | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:  # noqa: ANN001
    """Label rows (from start) and their point-in-time features, with the join
    keys and request columns read from the registry, not from constants."""
    views = [store.get_feature_view(n) for n in prepare.FEATURE_VIEWS[:2]]
    odfv = store.get_on_demand_feature_view(prepare.FEATURE_VIEWS[2])
    keys = sorted({k for v in views for k in v.join_keys})
    requests = sorted(f.name for s in odfv.source_request_sources.values() for f in s.schema)
    source = store.get_data_source(prepare.LABEL_SOURCE)
    labels = pd.read_parquet(source.path)
    if start is not None:
        labels = labels[labels[source.timestamp_field] >= start]
    entity_df = labels[[*keys, *requests, prepare.LABEL_COLUMN, source.timestamp_field]]
    refs = [f"{v.name}:{f.name}" for v in [*views, odfv] for f in v.features]
    frame = store.get_historical_features(entity_df=entity_df, features=refs).to_df()
    return labels, frame.sort_values("event_timestamp", kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return prepare.prepare(tmp_path_factory.mktemp("maintenance") / "repo", generate.Period(start=START, **SMALL))


@pytest.fixture(scope="module")
def reference(repo, tmp_path_factory):
    """The joined reference period, read before any test appends to the repository."""
    store = open_from_configmap(repo.repo, tmp_path_factory.mktemp("client"))
    labels, frame = join(store)
    return {"store": store, "labels": labels, "frame": frame}


@pytest.fixture(scope="module")
def drifted(repo, reference, tmp_path_factory):
    added = prepare.append_period(repo.repo, days=3, drifted=True)
    store = open_from_configmap(repo.repo, tmp_path_factory.mktemp("client-after"))
    labels, frame = join(store, start=pd.Timestamp(added.period.start))
    return {"added": added, "labels": labels, "frame": frame}


def test_the_generator_is_deterministic_and_continues_the_world():
    period = generate.Period(start=generate.default_start(3), days=3, machines=20)
    first, again = generate.simulate(period), generate.simulate(period)
    for name in generate.TABLES:
        pd.testing.assert_frame_equal(first[name], again[name])
    later = generate.simulate(generate.Period(start=period.end, days=3, machines=20))
    # The next period is new weather and new states, not a replay.
    assert not np.allclose(first["machine_telemetry"]["vibration_rms"], later["machine_telemetry"]["vibration_rms"])
    assert later["machine_telemetry"]["event_timestamp"].min() > first["machine_telemetry"]["event_timestamp"].max()
    assert set(first["maintenance_events"]["fault_type"]) == set(generate.FAULTS)
    with pytest.raises(ValueError, match="midnight"):
        generate.Period(start=period.start + pd.Timedelta(hours=1))


def test_the_configmap_holds_absolute_paths_and_the_repository_its_own_objects(repo, reference):
    store = reference["store"]
    config = yaml.safe_load(repo.config)
    assert config["project"] == "maintenance"
    for path in (config["registry"]["path"], config["online_store"]["path"]):
        assert Path(path).is_absolute() and Path(path).exists(), path
    assert {e.name for e in store.list_entities()} == {"machine", "site"}
    assert {v.name for v in store.list_feature_views()} == set(prepare.FEATURE_VIEWS[:2])
    assert all(Path(store.get_data_source(n).path).is_absolute() for n in
               ("maintenance_events", "machine_telemetry_hourly", "site_conditions_daily"))


FRESH_CLIENT = """
import json, sys, yaml
from feast import FeatureStore, RepoConfig
text = yaml.safe_load(open(sys.argv[1]))["data"]["feature_store.yaml"]
store = FeatureStore(config=RepoConfig(repo_path=sys.argv[2], **yaml.safe_load(text)))
row = {"machine_id": 7, "site_id": "plant-east", "load_pct": 50.0, "rpm": 2000}
print(json.dumps(store.get_online_features(
    features=["machine_telemetry:vibration_rms", "operating_context:vibration_per_krpm"], entity_rows=[row]).to_dict()))
"""


def test_a_process_that_never_saw_the_definitions_runs_the_on_demand_view(repo, tmp_path):
    """kubeloop's data step and server hold only the ConfigMap: the
    on-demand view's function must come from the registry (Feast re-executes
    its stored source with only pd and np in scope), and the online store
    must hold the materialised period."""
    out = subprocess.run([sys.executable, "-c", FRESH_CLIENT, str(repo.configmap), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    features = json.loads(out.stdout.strip().splitlines()[-1])
    assert features["vibration_rms"][0] is not None
    assert features["vibration_per_krpm"][0] == pytest.approx(features["vibration_rms"][0] / 2.0, rel=1e-5)


def test_every_labelled_row_gets_its_features(repo, reference):
    """Feast's file offline store drops rows whose features are older than a
    view's ttl: hourly telemetry (ttl 6 h) and daily site rows (ttl 2 d)
    cover every inspection, so none may go."""
    labels, frame = reference["labels"], reference["frame"]
    assert len(labels) == repo.counts["maintenance_events"] == SMALL["machines"] * SMALL["days"] * 4
    assert len(frame) == len(labels)
    assert frame[FEATURES].notna().all().all(), frame[FEATURES].isna().sum()
    # The on-demand view ran on the request columns.
    np.testing.assert_allclose(frame["temperature_per_load"], frame["temperature_mean"] / frame["load_pct"], rtol=1e-5)


def test_the_features_determine_the_fault(reference):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    frame = reference["frame"]
    cut = int(len(frame) * 0.8)  # train on the past, judge on the most recent fifth
    train, test = frame.iloc[:cut], frame.iloc[cut:]
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    model.fit(train[FEATURES], train[prepare.LABEL_COLUMN])
    predicted = model.predict(test[FEATURES])
    accuracy = float((predicted == test[prepare.LABEL_COLUMN]).mean())
    balanced = balanced_accuracy_score(test[prepare.LABEL_COLUMN], predicted)
    majority = test[prepare.LABEL_COLUMN].value_counts(normalize=True).max()
    print(f"logistic regression accuracy {accuracy:.3f} (balanced {balanced:.3f}), majority class rate {majority:.3f}")
    assert accuracy > majority + 0.1
    # Always answering "none" would score 0.25 here: every fault is recognised.
    assert balanced > 0.7


def test_a_drifted_period_moves_the_inputs_and_keeps_every_row(reference, drifted):
    before, after = reference["frame"], drifted["frame"]
    assert len(after) == len(drifted["labels"]) == drifted["added"].counts["maintenance_events"]
    assert after[FEATURES].notna().all().all()
    shift = {c: (after[c].mean() - before[c].mean()) / before[c].std() for c in FEATURES}
    print("shift in reference standard deviations:", {c: round(s, 2) for c, s in shift.items()})
    for column in ("ambient_temperature", "humidity", "vibration_rms", "temperature_mean"):
        assert shift[column] > 0.5, (column, shift[column])
    # The fault mix is the same world's: drift moves the inputs, not the classes.
    mix = before[prepare.LABEL_COLUMN].value_counts(normalize=True)
    assert set(after[prepare.LABEL_COLUMN]) == set(mix.index)


def load_factory(folder: Path, reference: str):  # noqa: ANN201 - the factory
    """module:function from a folder, the way the local backend resolves spec.model."""
    module, function = reference.split(":")
    spec = importlib.util.spec_from_file_location(f"user_{module}", folder / f"{module}.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return getattr(loaded, function)


@pytest.fixture(scope="module")
def maintenance_data(reference):
    frame = reference["frame"]
    x = frame[FEATURES].to_numpy(np.float64)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    classes = sorted(generate.FAULTS)
    return x, frame[prepare.LABEL_COLUMN].map(classes.index).to_numpy(np.int64)


def fraud_like_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A rare positive class driven by an interaction, the shape of the fraud
    features (the card-transaction store itself is the e2e tests' business)."""
    x = rng.normal(size=(4096, 15)).astype(np.float32)
    logit = -2.5 + 1.5 * x[:, 0] + 1.2 * x[:, 1] * x[:, 2]
    return x, (rng.random(4096) < 1 / (1 + np.exp(-logit))).astype(np.int64)


CASES = {
    "maintenance": (EXAMPLES / "maintenance" / "model", "maintenance_model:build", {"hidden": 64, "blocks": 2}),
    "byo-fraud": (EXAMPLES / "byo-fraud" / "model", "fraud_model:build", {"width": 64, "depth": 2, "dropout": 0.1}),
}


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared two-core machine two spinning OpenMP
    threads made these small steps sixty times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("case", CASES)
def test_the_factory_builds_a_module_that_trains_and_exports(case, request, tmp_path, one_thread):
    import onnxruntime as ort
    import torch

    folder, reference, parameters = CASES[case]
    if case == "maintenance":
        x, y = request.getfixturevalue("maintenance_data")
        n_outputs, loss_fn = len(generate.FAULTS), torch.nn.CrossEntropyLoss()
    else:
        x, y = fraud_like_data(np.random.default_rng(3))
        n_outputs, loss_fn = 1, torch.nn.BCEWithLogitsLoss()
    torch.manual_seed(0)
    model = load_factory(folder, reference)(x.shape[1], n_outputs, **parameters)
    assert model(torch.from_numpy(x[:5])).shape == (5, n_outputs)

    target = torch.from_numpy(y) if n_outputs > 1 else torch.from_numpy(y).float().unsqueeze(1)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, order = [], np.random.default_rng(0).permutation(len(x))
    for step in range(60):
        batch = order[(step * 128) % len(x):][:128]
        loss = loss_fn(model(torch.from_numpy(x[batch])), target[batch])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10]), losses

    model.eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (torch.from_numpy(x[:2]),), str(path), input_names=["features"], output_names=["scores"],
                      dynamic_axes={"features": {0: "batch"}, "scores": {0: "batch"}}, opset_version=17, dynamo=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 37):
        (scores,) = session.run(None, {"features": x[:batch]})
        assert scores.shape == (batch, n_outputs)
        with torch.no_grad():
            np.testing.assert_allclose(scores, model(torch.from_numpy(x[:batch])).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("parameters", [{"hidden": 0}, {"dropout": 1.5}])
def test_a_bad_parameter_is_named(parameters):
    factory = load_factory(EXAMPLES / "maintenance" / "model", "maintenance_model:build")
    with pytest.raises(ValueError, match=next(iter(parameters))):
        factory(10, 4, **parameters)


def test_the_manifests_name_the_examples_objects():
    """The manifests point at what prepare.py creates and the modules define."""
    job = yaml.safe_load((EXAMPLES / "maintenance" / "trainingjob.yaml").read_text())["spec"]
    assert job["task"] == "multiclass"
    assert job["features"]["store"]["configMap"] == {"name": prepare.CONFIGMAP_NAME, "key": prepare.CONFIGMAP_KEY}
    assert job["features"]["featureViews"] == list(prepare.FEATURE_VIEWS)
    assert job["features"]["labels"] == {"source": prepare.LABEL_SOURCE, "column": prepare.LABEL_COLUMN}
    assert load_factory(EXAMPLES / "maintenance" / "model", job["model"]["factory"])
    fraud = yaml.safe_load((EXAMPLES / "byo-fraud" / "trainingjob.yaml").read_text())["spec"]
    assert fraud["task"] == "binary" and load_factory(EXAMPLES / "byo-fraud" / "model", fraud["model"]["factory"])
