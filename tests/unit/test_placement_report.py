"""`kubeloop placement plan`'s report, as plain data and as text (unit: the
fleet file's nodes, no API server)."""

from __future__ import annotations

import json

import yaml

from kubeloop.cli.placement import build_report, render_text
from tests.unit.test_placement import GiB, fleet


def services() -> list[dict]:
    """Twelve services of 3 to 70 GiB, as a platform engineer tried them."""
    sizes = [3, 5, 8, 12, 15, 20, 25, 30, 38, 45, 60, 70]
    return [{"metadata": {"name": f"m{size}", "namespace": "ml"},
             "spec": {"model": {"name": f"m{size}", "alias": "champion"},
                      "gpu": {"sharing": "mig" if size % 2 else "auto", "memoryMib": size * GiB}}}
            for size in sizes]


def test_the_report_is_plain_data_for_yaml_and_json():
    report = build_report(services(), fleet(), None, "default")
    assert [s["name"] for s in report["services"]][:2] == ["ml/m3", "ml/m5"]
    assert json.loads(json.dumps(report)) == report == yaml.safe_load(yaml.safe_dump(report))
    sixty = next(s for s in report["services"] if s["name"] == "ml/m60")
    assert not sixty["feasible"] and sixty["relayout"]["node"] == "gpu-h100-mig-mixed"
    assert "fits after relabelling" in sixty["reason"]


def test_the_text_fits_an_80_column_terminal():
    text = render_text(build_report(services(), fleet(), None, "default"), 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    # Reasons wrap into lines of words, not one word per line.
    reason_lines = [line for line in lines if line.startswith("    ")]
    assert sum(len(line) for line in reason_lines) / len(reason_lines) > 30
    assert "ml/m60  auto  61440 MiB  -> fits after a relayout" in text


def pooled(name: str, pool: str = "shared") -> dict:
    return {"metadata": {"name": name, "namespace": "ml"},
            "spec": {"model": {"name": "fraud", "alias": "champion"}, "pool": pool}}


def test_a_pools_models_are_packed_by_measured_size_then_estimate_the_rest_loaded_on_demand():
    from kubeloop.serving.base import PoolSize

    objects = [pooled(f"s{i}") for i in range(6)] + [pooled("elsewhere", pool="gone")]
    sizes = {"shared": PoolSize(members=2, memoryMiB=90.0, estimateMiB=20.0)}
    measured = {"shared": {"ml.s0": 50.0, "ml.s1": 40.0, "ml.s2": 30.0, "ml.s3": 95.0}}
    report = build_report(objects, fleet(), None, "default", sizes, measured)
    gone, shared = report["pools"]
    assert gone == {"name": "gone", "error": "no pool 'gone' in KUBELOOP_SERVING_POOLS (named: shared)"}
    assert shared["budgetMib"] == 81.0
    assert {m["model"]: (m["sizeMib"], m["source"]) for m in shared["models"]} == {
        "ml.s0": (50.0, "measured"), "ml.s1": (40.0, "measured"), "ml.s2": (30.0, "measured"),
        "ml.s3": (95.0, "measured"), "ml.s4": (20.0, "estimate"), "ml.s5": (20.0, "estimate")}
    # Largest first onto the member with most room: 50 | 40, 30 | then 20 beside 50; the last 20 fits nowhere.
    assert shared["held"] == {"member-0": {"models": ["ml.s0", "ml.s4"], "usedMib": 70.0},
                              "member-1": {"models": ["ml.s1", "ml.s2"], "usedMib": 70.0}}
    assert shared["onDemand"] == ["ml.s5"] and shared["tooLarge"] == ["ml.s3"] and shared["unknown"] == []
    text = render_text(report, 80)
    assert "ml/s0  cpu  -  -> pool shared" in text
    assert "pool shared: 2 members x 90 MiB (81 MiB for models after 10% headroom); 6\nmodels" in text
    assert "loaded on demand (least recently used unloaded): 1: ml.s5" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_pool_with_no_estimate_leaves_models_never_loaded_unknown():
    from kubeloop.gpu.pools import PooledModel, pack

    plan = pack([PooledModel("a", 10.0, "measured"), PooledModel("b", None, "unknown")], 1, 50.0, 0.1)
    assert plan.members[0].models == ("a",) and plan.unknown == ("b",) and plan.budget_mib == 45.0
