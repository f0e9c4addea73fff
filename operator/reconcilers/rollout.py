"""A rollout: the challenger's share of traffic moves through the spec's
steps; at every step the challenger is judged against the champion on the
same keyed traffic, and the first guardrail that fails aborts it (all
traffic back to the champion, the alias not moved).

Guardrails, each checked whenever the reconcile runs (so they look many
times per step: the sequential tests keep the false-alarm rate at alpha
however often they look):
- failed requests: an always-valid test that the challenger's 5xx share is
  higher than the champion's by more than maxErrorRateIncrease;
- p99 latency: the challenger's over the champion's, read over the step
  less its first LATENCY_SETTLE seconds, once both answered minRequests and
  at least LATENCY_REQUESTS there;
- disagreement: the lower end of the 95% interval of the share of paired
  requests decided differently above maxDisagreement;
- live loss: once labels arrive (spec.monitoring.groundTruth), an
  always-valid paired test that the challenger's mean loss on the same
  requests is higher than the champion's by more than maxLossIncrease.
A step passes when its duration has run, the challenger answered
minRequests in it, MIN_PAIRED of its rows were paired, minLabelled paired
requests have labels, and no guardrail failed.

Pure: the traffic sample and the outcome streams come in, a status goes out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from kubeloop.api.outcomes import ROLLOUT_ACTIONS, Rollout, RolloutAnalysis, RolloutStatus, StepAnalysis
from kubeloop.api.times import epoch, iso, seconds
from kubeloop.monitoring.outcomes.sequential import Stream, compare, compare_paired
from kubeloop.monitoring.outcomes.traffic import TrafficSample

FINAL = ("Promoted", "Aborted")
MIN_PAIRED = 30
"""Paired rows before disagreement is judged (its interval is wide below),
and before a step can pass: a contrary challenger at a small first step
with little traffic passed it unjudged on the real node."""
LATENCY_REQUESTS = 200
"""Requests each version answers in a step before their p99s are compared:
with fewer, a p99 is one slow call (a version's first calls after it
loaded are slower, and measured that way a challenger as fast as the
champion read 8x its p99)."""
LATENCY_SETTLE = 10.0
"""Seconds at the start of each step that the p99s do not read. A version's
first calls at a new share are slow for reasons that pass (its first
inferences, the front's first connections to it): on the real node, beside
another test's load, a new challenger's p99 read 2.5 s against the
champion's 4.9 ms over a 20 s step, and a good version was aborted."""


@dataclass(frozen=True)
class PairedLosses:
    """Per-request losses of both versions on the same labelled requests."""

    champion: Stream
    challenger: Stream
    differences: Stream
    """challenger - champion, request by request."""


@dataclass(frozen=True)
class Evidence:
    """What a step's analysis reads."""

    traffic: TrafficSample | None
    """The front's measurements over the step, None while they cannot be had."""
    losses: PairedLosses | None = None
    """The labelled paired requests, once labels have arrived."""


def start(rollout: Rollout, champion: str, challenger: str, now: float, action: str | None) -> RolloutStatus:
    """A new rollout at its first step. A hand action already on the object
    was meant for an earlier rollout: it is remembered, not applied."""
    first = rollout.steps[0]
    return RolloutStatus(challenger=challenger, champion=champion, weight=first.weight, step_started_at=iso(now),
                         action=action, message=f"step 1 of {len(rollout.steps)}: {first.weight}% for {first.duration}")


def advance(rollout: Rollout, status: RolloutStatus, evidence: Evidence, now: float,
            action: str | None = None, serving: bool = True) -> RolloutStatus:
    """The rollout's next state: a new hand action first, then the analysis.
    serving: whether the challenger answers its share yet; until it does,
    its step's time does not run."""
    if status.phase in FINAL:
        return status
    if action and action != status.action:
        return _act(rollout, status, action, now)
    if status.phase == "Paused":
        return status
    if not serving:
        return status.model_copy(update={"step_started_at": iso(now), "message": f"step {status.step + 1} waits "
                                         f"for version {status.challenger} to answer its {status.weight}%"})
    analysis = judge(rollout.analysis, status, evidence)
    if analysis.verdict == "Fail":
        return status.model_copy(update={"phase": "Aborted", "weight": 0, "analysis": analysis,
                                         "message": f"aborted at step {status.step + 1}: {analysis.message}"})
    step = rollout.steps[status.step]
    if analysis.verdict == "Pass" and now - epoch(status.step_started_at) >= seconds(step.duration):
        return _next_step(rollout, status, analysis, now)
    return status.model_copy(update={"analysis": analysis})


def _act(rollout: Rollout, status: RolloutStatus, action: str, now: float) -> RolloutStatus:
    if action not in ROLLOUT_ACTIONS:
        return status.model_copy(update={"action": action, "message": f"unknown rollout action {action!r}: "
                                         f"use one of {', '.join(ROLLOUT_ACTIONS)}"})
    update = {"action": action, "message": f"{action} by hand at step {status.step + 1}"}
    if action == "pause":
        update["phase"] = "Paused"
    elif action == "resume":
        update |= {"phase": "Progressing", "step_started_at": iso(now)}  # the step's time starts again
    elif action == "abort":
        update |= {"phase": "Aborted", "weight": 0}
    else:
        update |= {"phase": "Promoted", "weight": 100}
    return status.model_copy(update=update)


def _next_step(rollout: Rollout, status: RolloutStatus, analysis: StepAnalysis, now: float) -> RolloutStatus:
    following = status.step + 1
    if following == len(rollout.steps):
        return status.model_copy(update={"phase": "Promoted", "weight": 100, "analysis": analysis,
                                         "message": f"promoted after {len(rollout.steps)} step(s): {analysis.message}"})
    step = rollout.steps[following]
    return status.model_copy(update={
        "step": following, "weight": step.weight, "step_started_at": iso(now), "analysis": None,
        "message": f"step {following + 1} of {len(rollout.steps)}: {step.weight}% for {step.duration} "
                   f"(step {following} passed: {analysis.message})"})


def judge(spec: RolloutAnalysis, status: RolloutStatus, evidence: Evidence) -> StepAnalysis:
    """The step's guardrails over what was measured."""
    if evidence.traffic is None:
        return StepAnalysis(message="the front's measurements cannot be read yet")
    t, champion, challenger = evidence.traffic, status.champion, status.challenger
    served, base = t.requests.get(challenger, 0.0), t.requests.get(champion, 0.0)
    result = {"requests": int(served)}
    failures = []
    if served and base:
        rate, base_rate = t.errors.get(challenger, 0.0) / served, t.errors.get(champion, 0.0) / base
        result |= {"error_rate": round(rate, 5), "champion_error_rate": round(base_rate, 5)}
        failed, base_failed = t.errors.get(challenger, 0.0), t.errors.get(champion, 0.0)
        verdict = compare(Stream.from_sums(base, base_failed, base_failed), Stream.from_sums(served, failed, failed),
                          alpha=spec.alpha, margin=spec.max_error_rate_increase).verdict
        if verdict == "worse":
            failures.append(f"error rate {rate:.2%} against the champion's {base_rate:.2%} "
                            f"(at most +{spec.max_error_rate_increase:.2%})")
    enough = max(spec.min_requests, LATENCY_REQUESTS)
    timed, base_timed = t.timed.get(challenger, 0.0), t.timed.get(champion, 0.0)
    if timed >= enough and base_timed >= enough and champion in t.p99 and challenger in t.p99:
        slow, fast = t.p99[challenger], t.p99[champion]
        ratio = slow / fast if fast > 0 else math.inf
        result["latency_ratio"] = round(ratio, 3)
        if ratio > spec.max_latency_ratio and slow - fast > seconds(spec.latency_tolerance):
            failures.append(f"p99 latency {ratio:.2f}x the champion's ({slow * 1000:.1f} ms against "
                            f"{fast * 1000:.1f} ms; at most {spec.max_latency_ratio}x, or "
                            f"{spec.latency_tolerance} slower)")
    failures += _disagreement(spec, t, result)
    failures += _losses(spec, evidence.losses, result)
    if failures:
        return StepAnalysis(**result, verdict="Fail", message="; ".join(failures))
    if served < spec.min_requests:
        return StepAnalysis(**result, message=f"{int(served)} of {spec.min_requests} requests answered")
    if t.comparisons < MIN_PAIRED:
        return StepAnalysis(**result, message=f"{int(t.comparisons)} of {MIN_PAIRED} paired rows compared")
    if result.get("labelled", 0) < spec.min_labelled:
        return StepAnalysis(**result, message=f"{result.get('labelled', 0)} of {spec.min_labelled} paired "
                                              "requests labelled")
    return StepAnalysis(**result, verdict="Pass", message=_passed(result))


def _disagreement(spec: RolloutAnalysis, t: TrafficSample, result: dict) -> list[str]:
    if t.comparisons < MIN_PAIRED:
        return []
    share = min(1.0, t.disagreements / t.comparisons)  # increase() extrapolates each counter on its own
    result["disagreement"] = round(share, 4)
    low = _wilson_low(share * t.comparisons, t.comparisons)
    if low > spec.max_disagreement:
        return [f"{share:.1%} of {int(t.comparisons)} paired rows decided differently "
                f"(at most {spec.max_disagreement:.0%})"]
    return []


def _losses(spec: RolloutAnalysis, losses: PairedLosses | None, result: dict) -> list[str]:
    if losses is None or losses.differences.n < 2:
        return []
    comparison = compare_paired(losses.differences, alpha=spec.alpha, margin=spec.max_loss_increase)
    result |= {"loss_difference": round(comparison.difference, 5), "labelled": losses.differences.n}
    if comparison.verdict == "worse":
        return [f"loss per labelled request {losses.challenger.mean:.4f} against the champion's "
                f"{losses.champion.mean:.4f} on the same {losses.differences.n} requests "
                f"(at most +{spec.max_loss_increase})"]
    return []


def _passed(result: dict) -> str:
    parts = [f"{result['requests']} requests"]
    if "error_rate" in result:
        parts.append(f"error rate {result['error_rate']:.2%}")
    if "latency_ratio" in result:
        parts.append(f"p99 {result['latency_ratio']}x")
    if "disagreement" in result:
        parts.append(f"disagreement {result['disagreement']:.1%}")
    if "loss_difference" in result:
        parts.append(f"loss {result['loss_difference']:+.4f} over {result['labelled']} labels")
    return ", ".join(parts)


def _wilson_low(hits: float, n: float, confidence: float = 0.95) -> float:
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = hits / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)
