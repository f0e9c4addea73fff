"""The loop judged by outcomes, as hops (`kubeloop demo --story outcomes`):
callers' labels arrive late; the label function of the fraud example
changes while its inputs do not; data drift stays quiet while the live AUC
falls; KubeloopConceptDrift fires in the platform's Prometheus; the retrain
is rolled out step by step on live metrics and promoted; then yesterday's
model, offered again as a challenger, is aborted at its first step.

Every hop checks what it claims from the sources of truth (the API server,
Prometheus, Alertmanager, the registry, the answers callers get), as
kubeloop.story.loop's do.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import requests

from kubeloop.api.constants import API_VERSION
from kubeloop.api.times import epoch
from kubeloop.story.labels import LabelFeed
from kubeloop.story.loop import Loop, StepFailed, wait_until
from kubeloop.story.traffic import Traffic, labelled_feature_rows

CONCEPT_ALERT = "KubeloopConceptDrift"
CONCEPT = 2.0
"""How far the label function moves (kubeloop.featurestore.generate): fraud
leaves night-time online payments for contactless ones at risky merchants."""


@dataclass(frozen=True)
class OutcomeTimings:
    """Short enough to watch live: labels 5 s after the answer, quality
    judged every 10 s over the last 2 minutes, two 30 s rollout steps that
    each wait for 500 labelled paired requests (at 50 requests a second of 4
    rows, 5% paired: about a minute). With fewer, yesterday's model (0.14
    more log loss per request, its differences' spread 0.67) can pass a
    step before the paired test is sure of it: at 300 it once did."""

    label_delay: float = 5.0
    schedule: str = "10s"
    window: str = "120s"
    min_rows: int = 2000
    max_drop: float = 0.03
    steps: tuple[tuple[int, str], ...] = ((20, "30s"), (50, "30s"))
    min_labelled: int = 500
    rate: float = 50.0


def outcome_docs(docs: list[dict], labels: Path, timings: OutcomeTimings) -> list[dict]:
    """The story's objects (pure): the TrainingJob, and the InferenceService
    judged by its outcomes, with late labels in `labels`, and a rollout for
    every challenger. The retrain skips optimisation (minutes the story
    does not need)."""
    out = []
    for doc in copy.deepcopy(docs):
        if doc["kind"] == "OptimizedModel":
            continue
        if doc["kind"] == "InferenceService":
            spec = doc["spec"]
            spec["monitoring"]["groundTruth"] = {"location": str(labels), "maxDelay": "10m"}
            spec["monitoring"]["performance"] = {"metric": "auc", "maxDrop": timings.max_drop,
                                                 "window": timings.window, "schedule": timings.schedule,
                                                 "minRows": timings.min_rows}
            # The story is judged by outcomes; its node is CI's busy one, where p99s of a few ms are noise.
            spec["rollout"] = {"steps": [{"weight": w, "duration": d} for w, d in timings.steps],
                               "analysis": {"minLabelled": timings.min_labelled, "maxLatencyRatio": 4.0,
                                            "latencyTolerance": "100ms"}}
            spec["retraining"].pop("optimization", None)
        out.append(doc)
    return out


@dataclass
class OutcomeLoop(Loop):
    """The outcome story against a platform and an operator already up."""

    labels_dir: Path | None = None
    """Where callers' labels land (the InferenceService's groundTruth.location)."""
    outcome_timings: OutcomeTimings = OutcomeTimings()

    def steps(self) -> list[tuple[str, Callable[[], str]]]:
        return [
            ("apply the examples, judged by outcomes (ground truth, live AUC, rollouts)", self.apply),
            ("train: Feast features -> torch -> MLflow, gated, promoted to champion", self.trained),
            ("serve: Triton answers for the champion", self.serving),
            ("callers' labels arrive 5 s late; the live AUC holds near the trained one", self.labelled_traffic),
            ("concept drift: fraud moves to contactless payments at risky merchants; the inputs do not move",
             self.change_concept),
            ("Evidently sees no input drift", self.inputs_unchanged),
            ("the live AUC falls below the trained one by more than maxDrop", self.quality_fell),
            ("Prometheus fires KubeloopConceptDrift and Alertmanager holds it", self.concept_alert),
            ("the operator starts a retraining TrainingJob for the concept drift", self.retrain_started),
            ("retrain on the recent labels", self.retrained),
            ("gate the challenger against the champion on the same data", self.gated),
            ("roll out step by step, judged on live traffic and live labels", self.rolled_out),
            ("promote: the champion alias moves, recorded in the audit trail", self.promoted),
            ("roll forward: Triton serves the new champion to all traffic", self.rolled_forward),
            ("yesterday's model offered again as a challenger is aborted at its first step", self.worse_aborted),
        ]

    # -- the hops ------------------------------------------------------------

    def labelled_traffic(self) -> str:
        t = self.outcome_timings
        self.feed = LabelFeed(self.labels_dir, t.label_delay).start()
        rows, labels = self._labelled(self.facts["serving"], self.reference_end.timestamp() - 14 * 86400,
                                      self.reference_end.timestamp() - 7 * 86400)
        self.traffic = Traffic(self.facts["url"], self.model, rows, rate=t.rate, reach=self.reach)
        self.traffic.use(rows, labels)
        self.traffic.feed = self.feed
        self.traffic.start()
        started = time.time()
        held = self._performance_after(started + 30, decayed=False)
        self.facts["baseline_performance"] = held
        return f"{_live_auc(self._primary(held))}; labels {held['labels']}"

    def change_concept(self) -> str:
        from kubeloop.featurestore.store import recent_period

        # The reference world's seed: the same cards and merchants, the same inputs' distribution.
        scenario = recent_period(days=14, drift=0.0, seed=7, concept=CONCEPT)
        counts = self.write_world(scenario)
        self.facts["drift_period"] = scenario
        self.traffic.use(*self._labelled(self.facts["serving"], scenario.start.timestamp(), None))
        self.facts["drift_injected_at"] = time.time()
        return (f"{counts['transactions']} transactions since {scenario.start:%Y-%m-%d %H:%M} relabelled by a new "
                f"fraud pattern (inputs as before); callers send them and their labels follow")

    def inputs_unchanged(self) -> str:
        drift = self._drift_after(self.facts["drift_injected_at"] + 20)
        if drift.get("drifted"):
            raise StepFailed(f"the inputs were judged drifted, though only the labels moved: {drift}")
        self.facts["concept_drift_share"] = drift["share"]
        return f"{drift['share']:.0%} of features drifted over {drift['rows']} logged rows: below the threshold"

    def quality_fell(self) -> str:
        after = self.facts["drift_injected_at"] + self._window() / 2
        fell = self._performance_after(after, decayed=True)
        self.facts["decayed_performance"] = fell
        return f"{_live_auc(self._primary(fell))}, maxDrop {self.outcome_timings.max_drop}; report {fell.get('report')}"

    def concept_alert(self) -> str:
        query = f'ALERTS{{alertname="{CONCEPT_ALERT}", alertstate="firing", namespace="{self.namespace}"}}'

        def firing() -> list | None:
            answer = requests.get(f"{self.urls['PROMETHEUS_URL']}/api/v1/query", params={"query": query}, timeout=5)
            return answer.json()["data"]["result"] or None

        wait_until(firing, 180 * self.scale, f"{CONCEPT_ALERT} firing in Prometheus", interval=2,
                   seen=lambda: str(self.status("InferenceService").get("performance")))
        self.facts["alert"] = self._alertmanager(CONCEPT_ALERT)
        return f"{CONCEPT_ALERT} firing in Prometheus and active in Alertmanager since {self.facts['alert']['startsAt']}"

    def retrain_started(self) -> str:
        detail = super().retrain_started()
        retraining = wait_until(lambda: self.status("InferenceService").get("retraining"), 30 * self.scale,
                                "the retrain in status")
        if retraining.get("reason") != CONCEPT_ALERT:
            raise StepFailed(f"the retrain records reason {retraining.get('reason')!r}, not {CONCEPT_ALERT}")
        return f"{detail}; reason {retraining['reason']}"

    def rolled_out(self) -> str:
        """Each step's weight seen served, each step passed on its analysis."""
        seen: dict[int, dict] = {}

        def finished() -> dict | None:
            status = self.status("InferenceService")
            rollout = status.get("rollout") or {}
            if rollout.get("challenger") == self.facts["challenger"]:
                seen.setdefault(rollout.get("step", 0), rollout)
                if rollout.get("phase") in ("Promoted", "Aborted"):
                    return rollout
            return None

        rollout = wait_until(finished, 600 * self.scale, "the rollout's end", interval=1,
                             seen=lambda: str(self.status("InferenceService").get("rollout")))
        if rollout["phase"] != "Promoted":
            raise StepFailed(f"the retrain's rollout ended {rollout['phase']}: {rollout['message']}")
        steps = len(self.outcome_timings.steps)
        if sorted(seen) != list(range(steps)):
            raise StepFailed(f"steps seen: {sorted(seen)}, expected every one of {steps}")
        self.facts["rollout"] = rollout
        analysis = rollout.get("analysis") or {}
        return f"{rollout['message']} (last step: {analysis.get('message', '')})"

    def worse_aborted(self) -> str:
        """The pre-drift model comes back as spec.canary: its first step's
        analysis finds it worse on the same labelled requests, all traffic
        goes back to the champion, and the alias does not move."""
        old, champion = self.facts["serving"], self.champion()
        self.registry.set_alias(self.model, "previous", old)
        name = self.service["metadata"]["name"]
        self.kube.merge_patch(API_VERSION, "InferenceService", name, {"spec": {"canary": {"alias": "previous",
                                                                                         "percent": 20}}},
                              self.namespace)
        self.traffic.use(*self._labelled(old, self.facts["drift_period"].start.timestamp(), None))
        before = dict(self.traffic.answered)
        aborted = wait_until(lambda: (r := self.status("InferenceService").get("rollout") or {})
                             .get("challenger") == old and r.get("phase") in ("Aborted", "Promoted") and r,
                             420 * self.scale, f"the rollout of version {old} ending",
                             seen=lambda: str(self.status("InferenceService").get("rollout")))
        if aborted["phase"] != "Aborted" or aborted.get("step") != 0:
            raise StepFailed(f"yesterday's model was not aborted at its first step: {aborted}")
        if self.champion() != champion:
            raise StepFailed(f"the champion alias moved to {self.champion()}")
        first = self.outcome_timings.steps[0][0]
        got = {v: n - before.get(v, 0) for v, n in self.traffic.answered.items()}
        share = got.get(old, 0) / max(1, sum(got.values()))
        if share > first / 100 + 0.05:
            raise StepFailed(f"version {old} answered {share:.0%} of requests during its rollout, more than its "
                             f"first step's {first}%")
        self.traffic.use(*self.traffic_rows_now())
        wait_until(lambda: (v := self.traffic.recent_versions()) and sum(v.values()) >= 50 and set(v) == {champion},
                   60 * self.scale, f"every answer from version {champion} again",
                   seen=lambda: str(dict(self.traffic.recent_versions())))
        self.facts["aborted"], self.facts["aborted_share"] = aborted, share
        return f"{aborted['message']}; version {old} answered {share:.0%} of requests meanwhile (first step {first}%)"

    def stop(self) -> None:
        super().stop()
        if getattr(self, "feed", None):
            self.feed.stop()

    # -- helpers -------------------------------------------------------------

    def traffic_rows_now(self) -> tuple:
        return self._labelled(self.facts["challenger"], self.facts["drift_period"].start.timestamp(), None)

    def _labelled(self, version: str, start: float, end: float | None) -> tuple:
        """Feature vectors of the version's columns for the transactions
        between start and end, point-in-time, and their labels."""
        import datetime as dt

        tags = self.registry.get_version(self.model, version).tags
        when = [dt.datetime.fromtimestamp(t, dt.timezone.utc) if t is not None else None for t in (start, end)]

        def rows() -> tuple | None:
            try:
                return labelled_feature_rows(self.feast_repo, self.training_spec, json.loads(tags["feature_columns"]),
                                             *when)
            except Exception:  # noqa: BLE001 - the operator's materialisation may be rewriting the registry file
                return None

        return wait_until(rows, 60 * self.scale, "the offline store's labelled rows", interval=1)

    def _window(self) -> float:
        from kubeloop.api.times import seconds

        return seconds(self.outcome_timings.window)

    def _primary(self, performance: dict) -> dict:
        return next(v for v in performance.get("versions", []) if v["role"] == "primary")

    def _performance_after(self, since: float, decayed: bool) -> dict:
        """The first outcome evaluation after since, with enough labelled
        predictions of the primary, that says decayed (or not)."""
        def result() -> dict | None:
            performance = self.status("InferenceService").get("performance") or {}
            at = performance.get("lastRunAt")
            primary = next((v for v in performance.get("versions", []) if v.get("role") == "primary"), None)
            if not at or epoch(at) < since or not primary or primary.get("value") is None:
                return None
            if primary["rows"] < self.outcome_timings.min_rows:
                return None
            return performance if bool(performance.get("decayed")) == decayed else None

        return wait_until(result, 300 * self.scale, f"an outcome evaluation {'decayed' if decayed else 'holding'}",
                          interval=2, seen=lambda: str(self.status("InferenceService").get("performance")))

    def _alertmanager(self, name: str) -> dict:
        url = f"{self.urls['ALERTMANAGER_URL']}/api/v2/alerts"
        params = [("filter", f'alertname="{name}"'), ("filter", f'namespace="{self.namespace}"')]
        return wait_until(lambda: next((a for a in requests.get(url, params=params, timeout=5).json()
                                        if a["status"]["state"] == "active"), None),
                          120 * self.scale, f"{name} reaching Alertmanager", interval=2)


def _live_auc(primary: dict) -> str:
    return (f"live AUC {primary['value']:.3f} [{primary['low']:.3f}, {primary['high']:.3f}] over {primary['rows']} "
            f"labelled predictions (trained {primary['trained']:.3f})")
