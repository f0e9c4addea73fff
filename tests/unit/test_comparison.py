"""Whether a rebuild reproduces its version (components.comparison): plain
data in, the verdict and the names of what changed out."""

from __future__ import annotations

import numpy as np
import pytest

from kubeloop.components.comparison import Build, OutputGap, Tolerance, compare, output_gap

RECORDED = Build(dataset_hash="aaaa", rows=1000, views={"card_activity": "f1", "card_profile": "f2"},
                 view_data={"card_activity": "d1", "card_profile": "d2", "(labels)": "l1"},
                 code={"git sha": "abc", "torch": "2.13.0", "factory code": "c1"},
                 metrics={"auc": 0.9, "brier": 0.02})
SAME_OUTPUTS = OutputGap(rows=200, max_abs=0.0, mean_abs=0.0, unit="probability")
AUC = Tolerance(("auc",), metric=0.01, output=0.01)


def rebuilt(**changes) -> Build:
    return Build(**{**RECORDED.__dict__, **changes})


def judge(build: Build, outputs: OutputGap = SAME_OUTPUTS, tolerance: Tolerance = AUC):
    return compare("fraud", "1", "run", RECORDED, build, outputs, tolerance)


def test_the_same_build_reproduces():
    report = judge(rebuilt(metrics={"auc": 0.905, "brier": 0.5}))
    assert report.reproduced and report.verdict == "reproduced"
    assert not report.causes
    # Only the checked metric is held to the tolerance; the others are shown.
    brier = next(m for m in report.metrics if m.name == "brier")
    assert not brier.checked and brier.delta == pytest.approx(0.48)


@pytest.mark.parametrize(("auc", "reproduced"), [(0.91, True), (0.9101, False), (0.8899, False)])
def test_the_metric_tolerance_is_inclusive(auc, reproduced):
    report = judge(rebuilt(metrics={"auc": auc, "brier": 0.02}))
    assert report.reproduced is reproduced
    if not reproduced:
        assert "auc |Δ|" in report.verdict and "> 0.01" in report.verdict


def test_changed_values_of_a_view_name_that_view():
    report = judge(rebuilt(dataset_hash="bbbb", view_data={**RECORDED.view_data, "card_profile": "XX"}))
    assert not report.reproduced
    assert report.failures == ["dataset hash bbbb is not the recorded aaaa"]
    assert report.causes == ["feature view card_profile: values changed"]
    assert "card_profile" in report.verdict and "card_activity" not in report.verdict


def test_a_changed_definition_and_changed_labels_are_named():
    report = judge(rebuilt(dataset_hash="bbbb", views={**RECORDED.views, "card_activity": "f9"},
                           view_data={**RECORDED.view_data, "(labels)": "l2"}))
    assert report.causes == ["feature view card_activity: definition f1 -> f9", "the label rows: values changed"]


def test_changed_code_is_named_even_when_the_numbers_agree():
    report = judge(rebuilt(code={**RECORDED.code, "git sha": "def", "factory code": "c2"}))
    assert report.reproduced
    assert report.causes == ["factory code: c1 -> c2", "git sha: abc -> def"]


def test_a_version_without_per_view_hashes_says_so():
    old = Build(**{**RECORDED.__dict__, "view_data": {}})
    report = compare("fraud", "1", "run", old, rebuilt(dataset_hash="bbbb"), SAME_OUTPUTS, AUC)
    assert any("recorded no per-view hashes" in c for c in report.causes)
    assert all(not r.changed for r in report.view_data)


def test_outputs_beyond_their_tolerance_fail_the_verdict():
    report = judge(RECORDED, OutputGap(rows=200, max_abs=0.3, mean_abs=0.02, unit="probability"))
    assert not report.reproduced and "outputs mean |Δ| 0.02 > 0.01" in report.verdict


def test_a_checked_metric_the_version_never_recorded_fails():
    report = judge(RECORDED, tolerance=Tolerance(("macro_f1",)))
    assert not report.reproduced and "macro_f1: no value to compare (recorded lacks it)" in report.failures


def test_output_gap_in_probability_and_in_spread_for_regression():
    registered, rebuilt_outputs = np.array([0.1, 0.5, 0.9]), np.array([0.1, 0.6, 0.9])
    gap = output_gap(registered, rebuilt_outputs, "binary")
    assert gap.max_abs == pytest.approx(0.1) and gap.mean_abs == pytest.approx(0.1 / 3) and gap.rows == 3
    values = np.array([100.0, 200.0, 300.0])
    scaled = output_gap(values, values + np.array([0.0, 0.0, 81.65]), "regression")
    assert scaled.max_abs == pytest.approx(1.0, rel=1e-3) and scaled.unit.startswith("std")


def test_the_report_serialises_with_its_verdict():
    data = judge(rebuilt(dataset_hash="bbbb")).to_dict()
    assert data["reproduced"] is False and data["verdict"].startswith("differs: dataset hash")
    assert data["dataset"] == {"name": "dataset hash", "recorded": "aaaa", "now": "bbbb", "changed": True}
