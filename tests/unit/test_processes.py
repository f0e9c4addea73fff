"""Background servers' environment."""

from __future__ import annotations

import json
import sys

from kubeloop.dev import processes


def test_a_server_does_not_inherit_feasts_prometheus_folder(tmp_path, monkeypatch):
    # As importing feast leaves it in the operator's environment.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/feast_metrics_gone")
    monkeypatch.setenv("KUBELOOP_KEPT", "yes")
    out = tmp_path / "env.json"
    code = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(sorted(os.environ)))"
    record = processes.start("probe", [sys.executable, "-c", code], tmp_path, env={"EXTRA": "1"})
    assert processes.wait_exit(record, timeout=30) == 0
    names = set(json.loads(out.read_text()))
    assert {"KUBELOOP_KEPT", "EXTRA"} <= names
    assert not names & set(processes.INHERITED_NOT)
