"""The loop as a sequence of hops. Each hop waits for one thing that must
happen and checks that it did, from the sources of truth: the API server,
the MLflow registry, Alertmanager, and the answers Triton gives. A hop that
does not happen raises StepFailed with what was seen instead.

`kubeloop demo` prints the hops as a timeline; the loop's end-to-end test
runs the same hops and asserts on the facts they collect.
"""

from __future__ import annotations

import copy
import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import requests

from kubeloop.api.conditions import ConditionType
from kubeloop.api.constants import API_VERSION, LABEL_RETRAIN_OF
from kubeloop.api.times import epoch, seconds
from kubeloop.api.training import TrainingJobSpec
from kubeloop.polling import wait_for
from kubeloop.registry.base import ModelRegistry
from kubeloop.registry.promotion import audit_trail
from kubeloop.story.traffic import Traffic, feature_rows, sent_columns

DRIFT_ALERT = "KubeloopDataDrift"


class StepFailed(Exception):
    """A hop of the loop did not happen."""


@dataclass(frozen=True)
class Timings:
    """Monitoring and canary timings short enough to watch the loop live
    (the examples use production-like ones: minutes, not seconds)."""

    schedule: str = "15s"
    window: str = "60s"
    min_rows: int = 300
    canary_duration: str = "20s"
    materialize_every: str = "10s"


def prepare(docs: list[dict], namespace: str, model: str, timings: Timings) -> list[dict]:
    """The example objects for one run of the story (pure): in the namespace,
    for the model name, with the story's timings."""
    out = []
    for doc in copy.deepcopy(docs):
        doc["metadata"] = {"name": doc["metadata"]["name"], "namespace": namespace}
        spec = doc["spec"]
        if doc["kind"] == "TrainingJob":
            spec["modelName"] = model
        elif doc["kind"] == "OptimizedModel":
            spec["source"]["name"] = model
        elif doc["kind"] == "InferenceService":
            spec["model"]["name"] = model
            if "features" in spec:
                spec["features"]["materializeEvery"] = timings.materialize_every
            if "monitoring" in spec:
                spec["monitoring"].update(schedule=timings.schedule, window=timings.window, minRows=timings.min_rows)
            if "retraining" in spec:
                spec["retraining"]["canaryDuration"] = timings.canary_duration
        out.append(doc)
    return out


def operator_env(platform_env: dict[str, str], feast_repo: Path, work_dir: Path, resync_seconds: float = 3) -> dict:
    """The operator's settings for the loop on the local platform: local
    pipelines and Triton, the MLflow registry, the object store's request
    log, and the webhooks Alertmanager and MLflow call."""
    keys = ("MLFLOW_TRACKING_URI", "KUBELOOP_WEBHOOK_PORT", "KUBELOOP_WEBHOOK_TOKEN_FILE",
            "KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE", "KUBELOOP_MLFLOW_WEBHOOK_URL", "KUBELOOP_PROMETHEUS_TARGETS",
            # Routers log requests to the object store, where the drift job reads them.
            "KUBELOOP_REQUEST_LOG", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION")
    return {
        **{k: platform_env[k] for k in keys},
        # Rollouts are analysed on what the platform's Prometheus scraped of the front.
        "KUBELOOP_PROMETHEUS_URL": platform_env["PROMETHEUS_URL"],
        "KUBELOOP_REGISTRY": "mlflow",
        "KUBELOOP_PIPELINE_BACKENDS": "local", "KUBELOOP_PIPELINE_BACKEND": "local",
        "KUBELOOP_SERVING_BACKENDS": "local", "KUBELOOP_SERVING_BACKEND": "local",
        "KUBELOOP_FEAST_REPO": str(feast_repo), "KUBELOOP_WORK_DIR": str(work_dir),
        "KUBELOOP_RESYNC_SECONDS": str(resync_seconds),
    }


def wait_until(probe: Callable[[], object], timeout: float, what: str, interval: float = 1.0,
               seen: Callable[[], str] | None = None):
    """probe()'s first truthy value; StepFailed after timeout, saying what was seen."""
    return wait_for(probe, timeout, what, interval, seen, error=StepFailed)


@dataclass
class Loop:
    """One run of the story against a platform and an operator already up."""

    kube: object
    """kubeloop.kube.Kube (kept loose: the story only reads and applies)."""
    registry: ModelRegistry
    urls: dict[str, str]
    docs: list[dict]
    feast_repo: Path
    scale: float = 1.0
    """Multiplies every timeout (slow machines)."""
    facts: dict = field(default_factory=dict)
    traffic: Traffic | None = None
    reach: Callable[[str], str | None] | None = None
    """Maps the InferenceService's URL to an address this machine reaches
    (kubeloop.story.cluster.Endpoints on the cluster path); None: as it is."""
    entities: bool = False
    """Callers send what a payment carries (entity keys and request-time
    columns) and the serving path reads the rest from the online store,
    which the operator keeps materialised (the local demo); False: callers
    send the model's whole feature vector, built from the offline store."""
    publish: Callable[[], object] | None = None
    """Called after the story changes the store's working copy, to carry the
    change where clients read it (a published store's sources); None: they
    read the working copy."""

    def __post_init__(self) -> None:
        self.namespace = self.docs[0]["metadata"]["namespace"]
        self.by_kind = {d["kind"]: d for d in self.docs}
        self.service = self.by_kind["InferenceService"]
        self.model = self.service["spec"]["model"]["name"]
        self.training_spec = TrainingJobSpec.model_validate(self.by_kind["TrainingJob"]["spec"])
        transactions = pd.read_parquet(self.feast_repo / "data" / "transactions.parquet", columns=["event_timestamp"])
        self.reference_end = transactions["event_timestamp"].max().to_pydatetime()

    # -- reading the world -------------------------------------------------

    def get(self, kind: str, name: str | None = None) -> dict:
        name = name or self.by_kind[kind]["metadata"]["name"]
        return self.kube.get(API_VERSION, kind, name, self.namespace) or {}

    def status(self, kind: str, name: str | None = None) -> dict:
        return self.get(kind, name).get("status", {})

    def _finished(self, kind: str, name: str | None = None, timeout: float = 900) -> dict:
        name = name or self.by_kind[kind]["metadata"]["name"]
        status = wait_until(lambda: (s := self.status(kind, name)).get("phase") in ("Succeeded", "Failed") and s,
                            timeout * self.scale, f"{kind} {name} finishing", interval=2,
                            seen=lambda: self._run_seen(kind, name))
        if status["phase"] != "Succeeded":
            reasons = "; ".join(c.get("message", c["reason"]) for c in status.get("conditions", [])
                                if c["status"] == "False")
            raise StepFailed(f"{kind} {name} failed: {reasons}")
        return status

    def champion(self) -> str | None:
        version = self.registry.get_alias(self.model, "champion")
        return version.version if version else None

    def steps(self) -> list[tuple[str, Callable[[], str]]]:
        """The hops in order, with what each shows."""
        return [
            ("apply the examples", self.apply),
            ("train: Feast features -> torch -> MLflow, gated, promoted to champion", self.trained),
            ("optimise: every technique measured, the fastest within budget promoted", self.optimized),
            ("serve: Triton answers for the champion", self.serving),
            ("send traffic: in-distribution requests; the drift job finds nothing", self.baseline_traffic),
            ("inject drift: the last two weeks become a drifted world, in Feast and in the requests", self.inject_drift),
            *([("materialise: the operator's schedule loads the drifted snapshots into the online store",
                self.materialized)] if self.entities else []),
            ("Evidently finds the drift", self.drift_detected),
            ("Prometheus fires KubeloopDataDrift and Alertmanager holds it", self.alert_fired),
            ("the operator starts a retraining TrainingJob owned by the InferenceService", self.retrain_started),
            ("retrain on the recent data", self.retrained),
            ("optimise the retrained model", self.retrain_optimized),
            ("gate the challenger against the champion on the same data", self.gated),
            ("canary: Triton answers part of the traffic with the challenger", self.canaried),
            ("promote: the champion alias moves, recorded in the audit trail", self.promoted),
            ("roll forward: Triton serves the new champion to all traffic", self.rolled_forward),
        ]

    # -- the hops ------------------------------------------------------------

    def apply(self) -> str:
        self.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        for doc in self.docs:
            self.kube.apply(doc, field_manager="kubectl")
        return ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in self.docs)

    def trained(self) -> str:
        status = self._finished("TrainingJob")
        version = status["model"]["version"]
        self.facts["trained"] = version
        promoted = next((c for c in status["conditions"] if c["type"] == ConditionType.PROMOTED), None)
        return (f"{self.model} version {version}, hold-out AUC {status['metrics'].get('auc', 0):.3f}"
                + (f"; {promoted['message']}" if promoted else ""))

    def optimized(self) -> str:
        if "OptimizedModel" not in self.by_kind:
            return "no OptimizedModel in the story"
        status = self._finished("OptimizedModel")
        chosen = status.get("chosen") or {}
        self.facts["optimized"] = status["model"]["version"]
        return (f"{chosen.get('technique')} is {chosen.get('speedup', 0):.2f}x the source, version "
                f"{status['model']['version']}; champion is now version {self.champion()}")

    def serving(self) -> str:
        champion = self.champion()

        def answering():
            status = self.status("InferenceService")
            if status.get("phase") != "Ready" or status.get("modelVersion") != champion or not status.get("url"):
                return None
            base = self.reach(status["url"]) if self.reach else status["url"]
            try:
                ok = base is not None and requests.get(f"{base}/v2/health/ready", timeout=2).status_code == 200
            except requests.RequestException:
                return None
            return status if ok else None

        status = wait_until(answering, 180 * self.scale, f"Triton serving champion version {champion}",
                            seen=lambda: self._service_seen())
        self.facts["url"], self.facts["serving"] = status["url"], status["modelVersion"]
        return f"{status['url']} serves version {champion} (placement: {status['placement']['reason']})"

    def baseline_traffic(self) -> str:
        """In-distribution requests: transactions of the world the model
        knows, from the week before the last. Not the last week: the newest
        snapshots the online store serves summarise that week, each request's
        own amount among them, which the snapshot a model trains on never
        holds (it is computed before the transaction), and the drift job
        would see that skew, not the world."""
        requests_ = self._requests(self.facts["serving"], self.reference_end - dt.timedelta(days=14),
                                   self.reference_end - dt.timedelta(days=7))
        if self.entities:  # callers' features are read online: the store's first materialisation comes first
            self._features_fresh(120)
        self.traffic = Traffic(self.facts["url"], self.model, requests_, reach=self.reach).start()
        started = time.time()
        wait_until(lambda: sum(self.traffic.answered.values()) >= 20, 30 * self.scale, "answers to the first requests",
                   seen=lambda: f"{self.traffic.failed} failed, the last with {self.traffic.last_error}")
        drift = self._drift_after(started)
        self.facts["baseline_drift"] = drift
        if drift.get("drifted"):
            raise StepFailed(f"in-distribution traffic was judged drifted: {drift}")
        return (f"{self.traffic.sent} requests ({self._sending()}); {drift['share']:.0%} of features drifted over "
                f"{drift['rows']} logged rows: no drift")

    def inject_drift(self) -> str:
        """The world drifts: the last two weeks of every source are replaced by
        a drifted world's, its feature snapshots computed as of now, and the
        callers' transactions move with it. Nothing is materialised here: on
        the entity path the operator's schedule loads the new snapshots."""
        from kubeloop.featurestore.store import recent_period

        scenario = recent_period(days=14, drift=1.0, seed=11)
        counts = self.write_world(scenario)
        self.facts["drift_period"] = scenario
        self.traffic.use(self._requests(self.facts["serving"], scenario.start, None))
        self.facts["drift_injected_at"] = time.time()
        return (f"{counts['transactions']} drifted transactions since {scenario.start:%Y-%m-%d %H:%M} in Feast, "
                f"snapshots as of now; requests now carry them")

    def materialized(self) -> str:
        """The drifted snapshots reach the online store through the
        operator's materialisation schedule (the InferenceService's
        spec.features.materializeEvery), read back from Feast's registry,
        and the service says its features are fresh."""
        from kubeloop.api.signature import ModelSignature
        from kubeloop.featurestore.store import materialized_until, online_views, open_store

        end = self.facts["drift_period"].end.timestamp()
        views = ModelSignature.from_tags(self.registry.get_version(self.model, self.facts["serving"]).tags).feature_views

        def loaded() -> dict[str, float | None] | None:
            try:
                store = open_store(self.feast_repo)
                ends = materialized_until(store, online_views(store, list(views)))
            except Exception:  # noqa: BLE001 - the operator may be rewriting the registry file this instant
                return None
            return ends if all(e is not None and e > end for e in ends.values()) else None

        ends = wait_until(loaded, 120 * self.scale, "the schedule materialising past the drifted snapshots",
                          seen=lambda: self._service_seen())
        fresh = self._features_fresh(60)
        self.facts["materialized"] = ends
        after = min(ends.values()) - self.facts["drift_injected_at"]
        return f"{', '.join(sorted(ends))} materialised {after:.0f} s after the injection; {fresh['message']}"

    def _features_fresh(self, seconds: float) -> dict:
        """The service's FeaturesFresh condition once it is True."""
        return wait_until(lambda: next((c for c in self.status("InferenceService").get("conditions", [])
                                        if c["type"] == ConditionType.FEATURES_FRESH and c["status"] == "True"), None),
                          seconds * self.scale, "FeaturesFresh=True", seen=lambda: self._service_seen())

    def drift_detected(self) -> str:
        drift = self._drift_after(self.facts["drift_injected_at"], drifted=True)
        self.facts["drift"] = drift
        return (f"{drift['share']:.0%} of features drifted over {drift['rows']} rows "
                f"({', '.join(drift['featuresDrifted'][:4])}, ...); report {drift.get('report')}")

    def alert_fired(self) -> str:
        url = f"{self.urls['ALERTMANAGER_URL']}/api/v2/alerts"
        params = [("filter", f'alertname="{DRIFT_ALERT}"'), ("filter", f'namespace="{self.namespace}"'),
                  ("filter", f'inferenceservice="{self.service["metadata"]["name"]}"')]

        def firing():
            alerts = requests.get(url, params=params, timeout=5).json()
            return next((a for a in alerts if a["status"]["state"] == "active"), None)

        alert = wait_until(firing, 180 * self.scale, f"{DRIFT_ALERT} reaching Alertmanager", interval=2)
        self.facts["alert"] = alert
        return f"{DRIFT_ALERT} active since {alert['startsAt']} (fingerprint {alert['fingerprint']})"

    def retrain_started(self) -> str:
        selector = f"{LABEL_RETRAIN_OF}={self.service['metadata']['name']}"
        jobs = wait_until(lambda: self.kube.list(API_VERSION, "TrainingJob", self.namespace, selector),
                          120 * self.scale, "a retraining TrainingJob", interval=1,
                          seen=lambda: self._service_seen())
        if len(jobs) != 1:
            raise StepFailed(f"expected one retraining TrainingJob, found {[j['metadata']['name'] for j in jobs]}")
        job = jobs[0]
        owner = self.get("InferenceService")["metadata"]["uid"]
        if not any(o["uid"] == owner and o["kind"] == "InferenceService" for o in job["metadata"].get("ownerReferences", [])):
            raise StepFailed(f"TrainingJob {job['metadata']['name']} is not owned by the InferenceService")
        self.facts["retrain_job"] = job
        window = job["spec"]["features"].get("window", {})
        return f"TrainingJob/{job['metadata']['name']} (data {window.get('start', 'all')} .. {window.get('end')})"

    def retrained(self) -> str:
        name = self.facts["retrain_job"]["metadata"]["name"]
        status = self._finished("TrainingJob", name)
        self.facts["retrained"] = status["model"]["version"]
        return f"version {status['model']['version']}, hold-out AUC {status['metrics'].get('auc', 0):.3f}"

    def retrain_optimized(self) -> str:
        retraining = self._retraining_past("Optimizing")
        if not retraining.get("optimizedModel"):
            return "the retrain has no optimisation"
        status = self._finished("OptimizedModel", retraining["optimizedModel"])
        chosen = status.get("chosen") or {}
        return (f"OptimizedModel/{retraining['optimizedModel']}: {chosen.get('technique')} is "
                f"{chosen.get('speedup', 0):.2f}x the retrained model, registered as version {status['model']['version']}")

    def gated(self) -> str:
        retraining = self._retraining_past("Gating")
        if retraining["state"] in ("GateFailed", "Failed", "RolledBack"):
            raise StepFailed(f"retrain ended {retraining['state']}: {retraining['message']}")
        self.facts["challenger"] = retraining["challenger"]
        version = self.registry.get_version(self.model, retraining["challenger"])
        self.facts["gates"] = version.tags.get("kubeloop.gate.champion", "")
        return f"challenger version {retraining['challenger']}: " + retraining["message"].split("; canary")[0]

    def canaried(self) -> str:
        challenger = self.facts["challenger"]
        wait_until(lambda: self.traffic.answered[challenger] >= 20, 120 * self.scale,
                   f"Triton answering with challenger version {challenger}",
                   seen=lambda: str(dict(self.traffic.answered)))
        recent = self.traffic.recent_versions(100)
        percent = self.service["spec"]["retraining"].get("canaryPercent", 20)
        return (f"version {challenger} answered {recent[challenger]} of the last {sum(recent.values())} requests "
                f"(canary {percent}%), the champion the rest")

    def promoted(self) -> str:
        challenger = self.facts["challenger"]
        retraining = wait_until(lambda: (r := self.status("InferenceService").get("retraining") or {})
                                .get("state") in ("Promoted", "RolledBack", "Failed") and r,
                                300 * self.scale, "the end of the canary", seen=lambda: self._service_seen())
        if retraining["state"] != "Promoted":
            raise StepFailed(f"the canary ended {retraining['state']}: {retraining['message']}")
        if self.champion() != challenger:
            raise StepFailed(f"the champion alias is at version {self.champion()}, not {challenger}")
        entry = next((e for e in reversed(audit_trail(self.registry, self.model))
                      if e.action == "promote" and e.version == challenger), None)
        if entry is None:
            raise StepFailed(f"no audit entry for the promotion of version {challenger}")
        self.facts["promotion"] = entry
        return f"champion -> version {challenger} (was {entry.previous}); by {entry.by}: {entry.reason}"

    def rolled_forward(self) -> str:
        challenger = self.facts["challenger"]
        wait_until(lambda: self.status("InferenceService").get("modelVersion") == challenger, 60 * self.scale,
                   f"the InferenceService serving version {challenger}", seen=lambda: self._service_seen())
        self.traffic.use(*self.traffic_rows_now())
        wait_until(lambda: (v := self.traffic.recent_versions()) and sum(v.values()) >= 50 and set(v) == {challenger},
                   60 * self.scale, f"every answer from version {challenger}",
                   seen=lambda: str(dict(self.traffic.recent_versions())))
        self.facts["injection_to_promoted"] = time.time() - self.facts["drift_injected_at"]
        return (f"Triton answers every request with version {challenger}, "
                f"{self.facts['injection_to_promoted']:.0f} s after the drift was injected")

    def stop(self) -> None:
        if self.traffic:
            self.traffic.stop()

    # -- helpers -------------------------------------------------------------

    def write_world(self, scenario) -> dict[str, int]:  # noqa: ANN001 - a featurestore Scenario
        """The scenario's period written into the store's sources, where its clients read them."""
        from kubeloop.featurestore.store import write_period

        counts = write_period(self.feast_repo, scenario)
        if self.publish:
            self.publish()
        return counts

    def traffic_rows_now(self) -> tuple:
        """The drifted requests, as the version now served takes them, and
        their labels where callers' outcomes are fed back (None here)."""
        return self._requests(self.facts["challenger"], self.facts["drift_period"].start, None), None

    def _requests(self, version: str, start: dt.datetime, end: dt.datetime | None):  # noqa: ANN202
        """What callers send for the transactions between start and end: the
        columns a payment carries (entity path), else the version's feature
        vectors built from the offline store."""
        import json

        tags = self.registry.get_version(self.model, version).tags
        if self.entities:
            from kubeloop.api.signature import ModelSignature

            return sent_columns(self.feast_repo, ModelSignature.from_tags(tags), start, end)
        return feature_rows(self.feast_repo, self.training_spec, json.loads(tags["feature_columns"]), start, end)

    def _sending(self) -> str:
        return "entity keys and request columns; features read online" if self.entities else "feature vectors"

    def retrieval_latency(self) -> dict[str, float] | None:
        """The online-feature retrieval's quantiles (ms) over the run, as
        Prometheus has them from the front's histogram; None when nothing was
        read online."""
        if not self.entities:
            return None
        service = f"{self.namespace}/{self.service['metadata']['name']}"
        out = {}
        for q in (0.5, 0.99):
            query = (f"histogram_quantile({q}, sum by (le) (increase("
                     f'kubeloop_online_feature_retrieval_seconds_bucket{{service="{service}"}}[1h])))')
            result = requests.get(f"{self.urls['PROMETHEUS_URL']}/api/v1/query", params={"query": query},
                                  timeout=5).json()["data"]["result"]
            if not result:
                return None
            out[f"p{int(q * 100)}"] = float(result[0]["value"][1]) * 1000
        return out

    def _drift_after(self, since: float, drifted: bool | None = None) -> dict:
        """The first drift result computed from requests logged after since."""
        window = self.service["spec"]["monitoring"]["window"]
        settle = since + (0 if drifted is None else min(30.0, seconds(window) / 2))

        def result():
            drift = self.status("InferenceService").get("drift") or {}
            at = drift.get("lastRunAt")
            if not at or epoch(at) < settle or "share" not in drift:
                return None
            return drift if drifted is None or drift.get("drifted") == drifted else None

        return wait_until(result, 240 * self.scale, "a drift evaluation of the new requests", interval=2,
                          seen=lambda: str(self.status("InferenceService").get("drift")))

    def _retraining_past(self, state: str) -> dict:
        order = ["Training", "Optimizing", "Gating", "Canary", "Promoted"]

        def past():
            r = self.status("InferenceService").get("retraining") or {}
            s = r.get("state")
            done = s in ("GateFailed", "Failed", "RolledBack") or (s in order and order.index(s) > order.index(state))
            return r if done else None

        return wait_until(past, 900 * self.scale, f"the retrain moving past {state}", interval=2,
                          seen=lambda: self._service_seen())

    def _run_seen(self, kind: str, name: str) -> str:
        status = self.status(kind, name)
        said = "; ".join(f"{c['type']}: {c['message']}" for c in status.get("conditions", []) if c.get("message"))
        return f"phase {status.get('phase')}; {said}"

    def _service_seen(self) -> str:
        status = self.status("InferenceService")
        ready = {c["type"]: f"{c['status']} {c.get('message', '')[:120]}" for c in status.get("conditions", [])}
        return f"phase {status.get('phase')}, retraining {status.get('retraining')}, conditions {ready}"
