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
