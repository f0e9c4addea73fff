"""Data validation's checks as plain functions of data frames (no MLflow,
no Feast): each rule of spec.validation, the comparison with a champion's
schema, PSI findings, and the one-line summary a condition and a tag carry.
Unit: these prove the checks the validate step runs on either backend."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from kubeloop.api.training import ChampionComparison, ColumnRule, DataValidation, ShareRange, TrainingJobSpec
from kubeloop.components import validation as checks
from kubeloop.components.distributions import column_drift


def frame(rows: int = 1000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "amount": rng.uniform(0, 500, rows),
        "age": rng.integers(18, 90, rows).astype(float),
        "channel": rng.choice(["online", "in_store", "contactless"], rows),
        "is_fraud": (rng.uniform(size=rows) < 0.05).astype(int),
    })


def rule(**fields) -> ColumnRule:
    return ColumnRule.model_validate(fields)


def test_a_null_share_above_max_null_share_names_column_rule_and_values():
    data = frame()
    data.loc[: 969, "amount"] = np.nan
    found = checks.check_rule(data, rule(column="amount", maxNullShare=0.05))
    assert [(f.column, f.rule) for f in found] == [("amount", "maxNullShare")]
    assert found[0].message == "column 'amount': null share 0.97 is above maxNullShare 0.05"
    assert not checks.check_rule(data, rule(column="amount", maxNullShare=0.98))


def test_values_outside_min_and_max_are_counted_and_shown():
    data = frame()
    data.loc[:9, "amount"] = -1.0
    below = checks.check_rule(data, rule(column="amount", min=0))
    assert below[0].rule == "min" and below[0].values["rows"] == 10
    assert "10 of 1000 values (1.0%) are outside [0, inf] (seen -1 to" in below[0].message
    data.loc[:9, "amount"] = 9e6
    above = checks.check_rule(data, rule(column="amount", min=0, max=5000))
    assert above[0].rule == "max" and "outside [0, 5000]" in above[0].message and "to 9000000)" in above[0].message
    assert not checks.check_rule(frame(), rule(column="amount", min=0, max=500))


def test_categories_outside_the_allowed_list_are_named():
    data = frame()
    data.loc[:4, "channel"] = "atm"
    found = checks.check_rule(data, rule(column="channel", categories=["online", "in_store", "contactless"]))
    assert found[0].rule == "categories" and found[0].values == {"rows": 5, "unexpected": ["atm"]}
    # Whole numbers compare as 3, not 3.0.
    assert not checks.check_rule(frame(), rule(column="is_fraud", categories=["0", "1"]))


def test_a_rule_on_a_column_the_data_lacks_is_a_finding():
    found = checks.check_rule(frame(), rule(column="balance", maxNullShare=0.1))
    assert found[0].rule == "column" and "not in the training data" in found[0].message


def test_label_share_bounds_for_binary_and_multiclass():
    data = frame()
    binary = checks.check_label_share(data["is_fraud"], "binary", ShareRange.model_validate({"min": 0.2}))
    assert binary[0].rule == "labelShare.min" and "positive share 0.0" in binary[0].message
    assert not checks.check_label_share(data["is_fraud"], "binary", ShareRange.model_validate({"max": 0.2}))
    classes = checks.check_label_share(data["channel"].rename("kind"), "multiclass",
                                       ShareRange.model_validate({"max": 0.3}))
    assert {f.values["class"] for f in classes} == {"online", "in_store", "contactless"}
    assert all(f.rule == "labelShare.max" for f in classes)


def test_check_spec_runs_every_rule_and_the_label_share():
    data = frame()
    data.loc[: 499, "age"] = np.nan
    validation = DataValidation.model_validate({"rules": [{"column": "age", "maxNullShare": 0.1},
                                                          {"column": "amount", "max": 100}],
                                                "labelShare": {"min": 0.5}})
    found = checks.check_spec(data, "is_fraud", "binary", validation)
    assert [f.rule for f in found] == ["maxNullShare", "max", "labelShare.min"]


def test_the_inferred_schema_keeps_types_null_shares_ranges_categories_and_label_share():
    data = frame()
    data.loc[:99, "age"] = np.nan
    schema = checks.infer_schema(data, ["amount", "age", "channel"], "is_fraud", "binary")
    assert schema["columns"]["age"]["null_share"] == pytest.approx(0.1)
    assert schema["columns"]["amount"]["kind"] == "numeric" and 0 <= schema["columns"]["amount"]["min"] < 1
    assert schema["columns"]["channel"] == {"kind": "categorical", "null_share": 0.0,
                                            "categories": ["contactless", "in_store", "online"]}
    assert schema["label_shares"]["1"] == pytest.approx(data["is_fraud"].mean())


def compare(current: pd.DataFrame, champion: pd.DataFrame, **limits) -> list[checks.Finding]:
    columns = ["amount", "age", "channel"]
    before = checks.infer_schema(champion, columns, "is_fraud", "binary")
    now = checks.infer_schema(current, columns, "is_fraud", "binary")
    settings = ChampionComparison.model_validate(limits)
    return checks.compare_schemas(now, before, settings, "3") + checks.out_of_range(current, before, settings, "3")


def test_same_data_as_the_champion_finds_nothing():
    assert compare(frame(seed=1), frame(seed=2)) == []


def test_a_null_share_rise_over_the_champion_is_bounded_by_max_null_share_increase():
    corrupted = frame(seed=1)
    corrupted.loc[:299, "amount"] = np.nan
    found = compare(corrupted, frame(seed=2))
    assert [(f.column, f.rule, f.source) for f in found] == [("amount", "maxNullShareIncrease", "champion")]
    assert "null share 0.3 is 0.3 above the champion's (version 3) 0" in found[0].message
    assert compare(corrupted, frame(seed=2), maxNullShareIncrease=0.5) == []


def test_values_beyond_the_champions_range_use_range_tolerance_and_max_out_of_range_share():
    scaled = frame(seed=1)
    scaled["amount"] *= 1000
    found = compare(scaled, frame(seed=2))
    assert [(f.column, f.rule) for f in found] == [("amount", "maxOutOfRangeShare")]
    assert "outside the champion's (version 3) range [0" in found[0].message
    # 5% above the champion's max: inside a 10% tolerance, outside a 1% one.
    nudged = frame(seed=1)
    nudged.loc[:99, "amount"] = 525.0
    assert compare(nudged, frame(seed=2)) == []
    tight = {"rangeTolerance": 0.01}
    assert [f.rule for f in compare(nudged, frame(seed=2), **tight)] == ["maxOutOfRangeShare"]
    assert compare(nudged, frame(seed=2), **tight, maxOutOfRangeShare=0.2) == []


def test_unseen_categories_are_bounded_by_max_unseen_category_share():
    new = frame(seed=1)
    new.loc[:49, "channel"] = "atm"
    found = compare(new, frame(seed=2))
    assert [(f.column, f.rule) for f in found] == [("channel", "maxUnseenCategoryShare")]
    assert "never saw: atm" in found[0].message
    assert compare(new, frame(seed=2), maxUnseenCategoryShare=0.1) == []


def test_a_label_share_shift_is_bounded_by_max_label_share_shift():
    shifted = frame(seed=1)
    shifted.loc[:299, "is_fraud"] = 1
    found = compare(shifted, frame(seed=2))
    assert [(f.column, f.rule) for f in found] == [("is_fraud", "maxLabelShareShift")]
    assert compare(shifted, frame(seed=2), maxLabelShareShift=0.5) == []


def test_psi_over_the_threshold_is_a_finding_per_feature():
    """Evidently's psi test, as the validate step calls it, on a feature scaled 1000x."""
    before, now = frame(seed=1), frame(seed=2)
    now["amount"] *= 1000
    scores = column_drift(before, now, ["amount", "age"], method="psi", threshold=0.25).scores
    assert scores["amount"] > 1 and scores["age"] < 0.25
    found = checks.psi_findings(scores, ChampionComparison().psi_threshold, "3")
    assert [(f.column, f.rule) for f in found] == [("amount", "psiThreshold")]
    assert checks.psi_findings(scores, ChampionComparison.model_validate({"psiThreshold": 100}).psi_threshold,
                               "3") == []


def test_the_summary_is_one_bounded_line_naming_the_first_findings():
    findings = [checks.Finding(f"c{i}", "max", f"column 'c{i}': " + "x" * 900) for i in range(8)]
    warn = checks.Report(mode="warn", findings=findings)
    text = warn.summary()
    assert text.startswith("warn: 8 findings: column 'c0'") and "\n" not in text
    assert len(text) <= checks.MAX_MESSAGE + len("warn: ")
    assert checks.Report(mode="fail").summary() == "passed"
    assert checks.Report(mode="off").summary() == "not configured"
    short = checks.describe(findings[:7], limit=100000)
    assert short.endswith("and 2 more (validation/report.json)")
    again = checks.Report.from_json(warn.to_json())
    assert again.findings == findings and again.mode == "warn"


def test_numbers_read_as_people_write_them():
    assert checks.number(3.0) == "3" and checks.number(0.05) == "0.05" and checks.number(math.nan) == "none"


def test_mode_defaults_to_fail_and_the_champion_comparison_to_on():
    validation = DataValidation.model_validate({})
    assert validation.mode == "fail" and validation.champion.enabled
    assert DataValidation.model_validate({"mode": "warn"}).mode == "warn"
    assert TrainingJobSpec.model_validate({"modelName": "m", "features": {
        "featureViews": ["v"], "labels": {"source": "s", "column": "y"}}}).validation is None


def test_the_crd_carries_the_rules_cel_with_the_field_named():
    """The API server's checks (e2e tests/e2e/test_validation.py applies them)."""
    from kubeloop.api.training import TrainingJobSpec as Spec
    from kubeloop.api.schema import model_schema

    spec = model_schema(Spec)
    validation = spec["properties"]["validation"]
    rules = validation["properties"]["rules"]["items"]["x-kubernetes-validations"]
    assert {r["fieldPath"] for r in rules} == {".column", ".min", ".categories"}
    assert any(r["fieldPath"] == ".validation.labelShare" for r in spec["x-kubernetes-validations"])
    assert validation["properties"]["mode"]["enum"] == ["fail", "warn"]
    assert yaml.safe_dump(validation)
