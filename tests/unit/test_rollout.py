"""The rollout state machine: steps, guardrails and hand actions (pure; the
same code judges rollouts on the local and the cluster paths, whose
evidence comes from Prometheus there)."""

from __future__ import annotations

import numpy as np
import pytest

from kubeloop.api.outcomes import Rollout, RolloutAnalysis, RolloutStep
from kubeloop.monitoring.outcomes.sequential import Stream
from kubeloop.monitoring.outcomes.traffic import TrafficSample, queries
from kubeloop.operator.reconcilers.rollout import Evidence, PairedLosses, advance, judge, start

ROLLOUT = Rollout(steps=[RolloutStep(weight=5, duration="30s"), RolloutStep(weight=25, duration="30s"),
                         RolloutStep(weight=50, duration="30s")])
T0 = 1_800_000_000.0


def healthy(requests: int = 400, errors: int = 0, p99: float = 0.010, comparisons: int = 100,
            disagreements: int = 5, timed: int | None = None) -> Evidence:
    """timed: the challenger's requests in the latency window (all of them unless said)."""
    timed = requests if timed is None else timed
    return Evidence(TrafficSample(requests={"1": requests * 4, "2": requests}, errors={"1": 0, "2": errors},
                                  p99={"1": 0.010, "2": p99}, comparisons=comparisons, disagreements=disagreements,
                                  timed={"1": timed * 4, "2": timed}))


def test_a_healthy_challenger_moves_through_every_step_then_is_promoted():
    status = start(ROLLOUT, "1", "2", T0, None)
    assert (status.phase, status.step, status.weight) == ("Progressing", 0, 5)
    seen = [status.weight]
    now = T0
    for _ in range(3):
        early = advance(ROLLOUT, status, healthy(), now + 10)
        assert early.step == status.step and early.analysis.verdict == "Pass"  # its duration has not run yet
        now += 31
        status = advance(ROLLOUT, status, healthy(), now)
        seen.append(status.weight)
    assert seen == [5, 25, 50, 100]
    assert status.phase == "Promoted" and "promoted after 3 step(s)" in status.message


def test_a_step_waits_for_enough_requests_however_long_it_lasts():
    status = start(ROLLOUT, "1", "2", T0, None)
    later = advance(ROLLOUT, status, healthy(requests=10), T0 + 3600)
    assert later.step == 0 and later.analysis.verdict == "Inconclusive" and "10 of 50" in later.analysis.message


def test_without_measurements_the_rollout_waits_and_says_why():
    status = start(ROLLOUT, "1", "2", T0, None)
    later = advance(ROLLOUT, status, Evidence(None), T0 + 3600)
    assert later.step == 0 and later.phase == "Progressing" and "cannot be read" in later.analysis.message


@pytest.mark.parametrize("evidence, words", [
    (healthy(errors=80), "error rate 20.00%"),
    (healthy(p99=0.030), "p99 latency 3.00x the champion's (30.0 ms against 10.0 ms"),
    (healthy(comparisons=200, disagreements=120), "decided differently"),
])
def test_a_failed_guardrail_aborts_at_the_first_step(evidence, words):
    status = advance(ROLLOUT, start(ROLLOUT, "1", "2", T0, None), evidence, T0 + 5)
    assert status.phase == "Aborted" and status.weight == 0 and status.step == 0
    assert words in status.analysis.message and status.analysis.verdict == "Fail"
    assert advance(ROLLOUT, status, healthy(), T0 + 500) == status  # final


def test_within_the_guardrails_a_step_passes():
    spec = RolloutAnalysis()
    analysis = judge(spec, start(ROLLOUT, "1", "2", T0, None), healthy(errors=1, p99=0.012))
    assert analysis.verdict == "Pass" and analysis.latency_ratio == 1.2 and analysis.disagreement == 0.05


def test_a_small_p99_rise_is_within_the_tolerance_whatever_its_ratio():
    status = start(ROLLOUT, "1", "2", T0, None)
    assert judge(RolloutAnalysis(), status, healthy(p99=0.019)).verdict == "Pass"  # 1.9x, 9 ms slower
    tolerant = RolloutAnalysis(latency_tolerance="100ms")
    assert judge(tolerant, status, healthy(p99=0.050)).verdict == "Pass"  # 5x, 40 ms slower
    assert "p99 latency 12.00x" in judge(tolerant, status, healthy(p99=0.120)).message


def test_latency_waits_for_enough_requests_after_the_step_settled():
    """The p99s are compared only over the step less its first seconds, and
    only once both versions answered enough requests there: a slow start
    alone aborts nothing."""
    status = start(ROLLOUT, "1", "2", T0, None)
    early = judge(RolloutAnalysis(), status, healthy(p99=2.5, timed=150))
    assert early.verdict == "Pass" and early.latency_ratio is None
    assert "p99 latency" in judge(RolloutAnalysis(), status, healthy(p99=2.5, timed=250)).message


def paired(champion: np.ndarray, challenger: np.ndarray) -> PairedLosses:
    return PairedLosses(Stream.of(champion), Stream.of(challenger), Stream.of(challenger - champion))


def test_a_challenger_with_higher_loss_on_the_same_labelled_requests_is_aborted():
    """Paired: each request's difficulty is shared, so 600 requests show a
    0.05 rise in loss that two independent arms of this spread would not."""
    rng = np.random.default_rng(0)
    champion = rng.exponential(0.30, 600)
    worse, same = champion + rng.normal(0.05, 0.2, 600), champion + rng.normal(0.0, 0.2, 600)
    status = start(ROLLOUT, "1", "2", T0, None)
    aborted = advance(ROLLOUT, status, Evidence(healthy().traffic, paired(champion, worse)), T0 + 5)
    assert aborted.phase == "Aborted" and "loss per labelled request" in aborted.message
    kept = advance(ROLLOUT, status, Evidence(healthy().traffic, paired(champion, same)), T0 + 5)
    assert kept.phase == "Progressing" and kept.analysis.labelled == 600


def test_a_step_can_wait_for_labels():
    rollout = Rollout(steps=ROLLOUT.steps, analysis=RolloutAnalysis(min_labelled=500))
    status = start(rollout, "1", "2", T0, None)
    rng = np.random.default_rng(1)
    few = rng.exponential(0.3, 100)
    waiting = advance(rollout, status, Evidence(healthy().traffic, paired(few, few)), T0 + 60)
    assert waiting.step == 0 and "100 of 500 paired requests labelled" in waiting.analysis.message
    many = rng.exponential(0.3, 600)
    assert advance(rollout, status, Evidence(healthy().traffic, paired(many, many)), T0 + 60).step == 1


def test_hand_actions_pause_resume_promote_and_abort():
    status = start(ROLLOUT, "1", "2", T0, None)
    paused = advance(ROLLOUT, status, healthy(errors=200), T0 + 40, "pause")
    assert paused.phase == "Paused" and paused.weight == 5
    # Paused: no analysis, so no abort, and the same annotation is not taken again.
    assert advance(ROLLOUT, paused, healthy(errors=200), T0 + 80, "pause") == paused
    resumed = advance(ROLLOUT, paused, healthy(), T0 + 100, "resume")
    assert resumed.phase == "Progressing" and resumed.step_started_at != status.step_started_at
    assert advance(ROLLOUT, resumed, healthy(), T0 + 110, "resume").step == 0  # its step's time started again
    assert advance(ROLLOUT, resumed, healthy(), T0 + 110, "promote").phase == "Promoted"
    aborted = advance(ROLLOUT, resumed, healthy(), T0 + 110, "abort")
    assert (aborted.phase, aborted.weight) == ("Aborted", 0)
    odd = advance(ROLLOUT, resumed, healthy(), T0 + 110, "faster")
    assert odd.phase == "Progressing" and "unknown rollout action 'faster'" in odd.message


def test_an_action_left_from_an_earlier_rollout_is_not_applied_to_a_new_one():
    status = start(ROLLOUT, "1", "3", T0, "abort")
    assert advance(ROLLOUT, status, healthy(), T0 + 5, "abort").phase == "Progressing"


def test_the_queries_count_callers_answers_only():
    text = queries("ns/fraud", "1", "2", 60, 50)
    assert 'role=~"primary|canary"' in text["requests"] and "[60s]" in text["requests"]
    assert 'code=~"5.."' in text["errors"] and "histogram_quantile(0.99" in text["p99"]
    assert 'primary="1", canary="2"' in text["comparisons"]
    assert "[50s]" in text["p99"] and "_count{" in text["timed"] and "[50s]" in text["timed"]
    assert "p99" not in queries("ns/fraud", "1", "2", 60) and "timed" not in queries("ns/fraud", "1", "2", 60)


def test_a_step_s_time_runs_only_while_the_challenger_answers():
    """A challenger still loading (its predictor starting) does not use up
    its first step: the step's time starts when it answers."""
    status = start(ROLLOUT, "1", "2", T0, None)
    loading = advance(ROLLOUT, status, healthy(), T0 + 100, serving=False)
    assert loading.step == 0 and loading.step_started_at != status.step_started_at
    assert "waits for version 2" in loading.message
    assert advance(ROLLOUT, loading, healthy(), T0 + 110).step == 0  # 10 s of answering: not yet
    assert advance(ROLLOUT, loading, healthy(), T0 + 131).step == 1


def test_a_step_does_not_pass_before_enough_rows_were_paired():
    """Paired disagreement is part of every step's verdict: too few pairs, no pass."""
    status = start(ROLLOUT, "1", "2", T0, None)
    few = advance(ROLLOUT, status, healthy(comparisons=12, disagreements=12), T0 + 60)
    assert few.step == 0 and "12 of 30 paired rows compared" in few.analysis.message
    assert advance(ROLLOUT, status, healthy(comparisons=40, disagreements=2), T0 + 60).step == 1
