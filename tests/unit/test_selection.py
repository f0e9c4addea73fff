"""Accepting, rejecting and choosing variants by their latency intervals (pure, local)."""

from __future__ import annotations

import pytest

from kubeloop.api.optimization import AccuracyBudget, LatencySLO
from kubeloop.components.intervals import Estimate
from kubeloop.components.selection import FASTER, NOT_FASTER, OVERLAP, Measured, choose

SLO = LatencySLO(percentile="p99", milliseconds=1.0, batch_size=32)


def ms(value, width=0.02):
    """A latency with an interval of +-width (relative)."""
    return Estimate(value, value * (1 - width), value * (1 + width))


def row(technique, p99, metric, servable=True, error=None, divergence=0.01, width=0.02, size=1.0):
    return Measured(technique, "rt", {32: (ms(p99 / 2, width), ms(p99, width)), 1: (ms(0.01), ms(0.02))}, metric,
                    size, servable, error=error, divergence=divergence)


ROWS = [row("source", 0.10, 0.900, divergence=0.0), row("onnx", 0.03, 0.900, divergence=2e-7),
        row("onnx-int8", 0.02, 0.897), row("distillation", 0.05, 0.880),
        row("torch-compile", 0.01, 0.900, servable=False, divergence=1e-6),
        row("static-int8", 0.025, 0.9003),
        Measured("tensorrt-fp16", "-", error="TensorRT is not installed")]


def by_name(choice):
    return {r.technique: r for r in choice.rows}


def test_fastest_servable_variant_within_budget_wins():
    choice = choose(ROWS, AccuracyBudget(metric="auc", max_drop=0.01), SLO, "auc")
    rows = by_name(choice)
    assert choice.winner.technique == "onnx-int8" and choice.meets_slo
    assert choice.basis == FASTER and "below the source's" in choice.why and "runner-up static-int8" in choice.why
    assert rows["static-int8"].accepted
    assert rows["onnx-int8"].speedup.value == pytest.approx(5.0)
    assert rows["onnx-int8"].speedup.low == pytest.approx(0.098 / 0.0204)
    assert not rows["distillation"].accepted and "worsens by 0.0200" in rows["distillation"].reason
    assert rows["torch-compile"].accepted and "no ONNX form" in rows["torch-compile"].reason
    assert not rows["tensorrt-fp16"].accepted and rows["tensorrt-fp16"].reason.startswith("not built: TensorRT")
    assert rows["source"].reason.startswith("accepted; 5.00x")


def test_a_zero_budget_rejects_every_lossy_variant():
    choice = choose([r for r in ROWS if r.technique != "onnx"], AccuracyBudget(metric="auc", max_drop=0.0), SLO, "auc")
    rows = by_name(choice)
    assert choice.winner.technique == "source"
    assert not rows["onnx-int8"].accepted and not rows["distillation"].accepted
    assert rows["onnx-int8"].accuracy_delta == pytest.approx(-0.003)
    # Scoring as well on this hold-out does not make a quantised model the same model.
    assert not rows["static-int8"].accepted and "budget is 0" in rows["static-int8"].reason


def test_a_lossless_compiled_form_survives_a_zero_budget():
    choice = choose(ROWS, AccuracyBudget(metric="auc", max_drop=0.0), SLO, "auc")
    assert choice.winner.technique == "onnx"


def test_slo_misses_are_reported():
    slow = [row("source", 3.0, 0.9), row("onnx", 2.0, 0.9)]
    choice = choose(slow, AccuracyBudget(max_drop=0.01), SLO, "auc")
    assert choice.winner.technique == "onnx" and not choice.meets_slo


def test_a_lower_is_better_metric_rejects_a_rise_not_a_fall():
    """Regression budgets: RMSE rising by more than the budget rejects; falling is fine."""
    rows = [row("source", 0.10, 2.00, divergence=0.0), row("onnx-int8", 0.02, 2.30),
            row("static-int8", 0.03, 1.90)]
    choice = choose(rows, AccuracyBudget(metric="rmse", max_drop=0.1), SLO, "rmse")
    judged = by_name(choice)
    assert not judged["onnx-int8"].accepted and "rmse worsens by 0.3000" in judged["onnx-int8"].reason
    assert judged["static-int8"].accepted and choice.winner.technique == "static-int8"


def test_overlapping_intervals_choose_the_variant_that_changes_predictions_least():
    """onnx-int8 looks fastest, but its interval overlaps onnx's and
    static-int8's: the measurement cannot tell them apart, so the lossless
    onnx wins and the choice says why."""
    rows = [row("source", 0.10, 0.900, divergence=0.0), row("onnx", 0.032, 0.900, divergence=2e-7, width=0.1),
            row("onnx-int8", 0.030, 0.899, width=0.1), row("static-int8", 0.031, 0.900, divergence=0.004, width=0.1)]
    choice = choose(rows, AccuracyBudget(metric="auc", max_drop=0.01), SLO, "auc")
    assert choice.winner.technique == "onnx" and choice.basis == OVERLAP
    assert "intervals overlap" in choice.why and "changes the predictions least" in choice.why
    assert by_name(choice)["onnx-int8"].reason.startswith("accepted; 0.94x")


def test_among_equally_lossless_overlapping_variants_the_smaller_artifact_wins():
    rows = [row("source", 0.10, 0.9, divergence=0.0), row("onnx", 0.030, 0.9, divergence=3e-7, width=0.1, size=2.0),
            row("static-int8", 0.031, 0.9, divergence=5e-5, width=0.1, size=0.5)]
    choice = choose(rows, AccuracyBudget(metric="auc", max_drop=0.01), SLO, "auc")
    assert choice.winner.technique == "static-int8" and choice.basis == OVERLAP
    assert "smallest artifact" in choice.why


def test_a_variant_whose_interval_overlaps_the_sources_does_not_win():
    """Faster on paper (0.095 vs 0.100 ms) but inside the noise: the source is kept."""
    rows = [row("source", 0.100, 0.9, divergence=0.0, width=0.08), row("onnx", 0.095, 0.9, divergence=1e-7)]
    choice = choose(rows, AccuracyBudget(metric="auc", max_drop=0.01), SLO, "auc")
    assert choice.winner.technique == "source" and choice.basis == NOT_FASTER
    assert "overlaps the source's" in choice.why


def test_a_clear_winner_beats_the_runner_up_whatever_its_divergence():
    rows = [row("source", 0.10, 0.9, divergence=0.0), row("onnx", 0.05, 0.9, divergence=1e-7),
            row("onnx-int8", 0.02, 0.899, divergence=0.008)]
    choice = choose(rows, AccuracyBudget(metric="auc", max_drop=0.01), SLO, "auc")
    assert choice.winner.technique == "onnx-int8" and choice.basis == FASTER
