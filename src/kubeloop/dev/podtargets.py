"""The real node's Pods as Prometheus targets. Debian's Prometheus is built
without Kubernetes service discovery, so this small loop does that part:
every few seconds it lists the Pods on the real node that ask to be scraped
(`prometheus.io/scrape: "true"` and `prometheus.io/port`, as the cluster
backends' routers and Triton Pods do) and writes them as a file_sd target
file, labelled with namespace, Pod and InferenceService. KWOK's Pods are left
out: their addresses lead nowhere.

    python -m kubeloop.dev.podtargets --kubeconfig PATH --output FILE --node NAME
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from kubeloop.files import write_atomic

log = logging.getLogger("kubeloop.dev.podtargets")
SERVICE_LABEL = "kubeloop.dev/inferenceservice"


def pod_targets(pods: list[dict], node: str) -> list[dict]:
    """file_sd target groups of the running Pods on node that ask to be scraped (pure)."""
    groups = []
    for pod in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
        meta, status = pod["metadata"], pod.get("status", {})
        annotations = meta.get("annotations") or {}
        if (pod["spec"].get("nodeName") != node or status.get("phase") != "Running" or not status.get("podIP")
                or annotations.get("prometheus.io/scrape") != "true" or "prometheus.io/port" not in annotations):
            continue
        labels = {"namespace": meta["namespace"], "pod": meta["name"], "job": "kubernetes-pods"}
        service = (meta.get("labels") or {}).get(SERVICE_LABEL)
        if service:
            labels["inferenceservice"] = service
        groups.append({"targets": [f"{status['podIP']}:{annotations['prometheus.io/port']}"], "labels": labels})
    return groups


def main(argv: list[str] | None = None) -> int:
    from kubeloop.kube import Kube, KubeError

    parser = argparse.ArgumentParser(prog="python -m kubeloop.dev.podtargets")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--interval", type=float, default=3.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kube = Kube.from_kubeconfig(args.kubeconfig)
    written = None
    while True:
        try:
            text = json.dumps(pod_targets(kube.list("v1", "Pod"), args.node), indent=1)
            if text != written:
                write_atomic(args.output, text)
                written = text
        except (KubeError, OSError) as exc:  # the API server restarting: try again
            log.warning("listing Pods failed: %s", exc)
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
