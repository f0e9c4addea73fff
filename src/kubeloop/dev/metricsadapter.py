"""The custom metrics API on the local platform's real node: prometheus-adapter
(built from its Go module, tools/prometheus-adapter) serving
`custom.metrics.k8s.io/v1beta1` from the platform's Prometheus, so the real
HPA controller scales InferenceServices on Triton's metrics.

Its rules are the chart's (`charts/kubeloop/templates/prometheus-adapter.yaml`,
rendered by the pinned helm), so the platform serves exactly the metric names
a cluster's adapter serves with the chart, and `build_autoscaler` asks for.

It runs as a process on this machine, bound to the real node's address (as
CoreDNS does), behind a Service with an EndpointSlice naming that address:
the API server reaches an APIService's backend at an endpoint address
(`--enable-aggregator-routing`; Service addresses are blackholed on the host),
and Prometheus listens on 127.0.0.1, where a Pod could not reach it. The API
server proxies to it with the front proxy's client certificate
(kubeloop.dev.pki); the adapter authenticates that certificate and the user
it names, and asks the API server whether that user may read the metric
(delegated authentication and authorization), as a user of its own allowed
exactly that and to list Pods and Namespaces.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Callable

import yaml

from kubeloop.dev.binaries import binary, ensure, versions
from kubeloop.dev.dns import node_service
from kubeloop.dev.pki import IDENTITIES, NODE_IP, webhook_certificates
from kubeloop.kube import Kube
from kubeloop.paths import repo_root
from kubeloop.polling import wait_for
from kubeloop.processes import ProcessRecord, free_port, log_tail

NAMESPACE = "monitoring"
NAME = "prometheus-adapter"
PROCESS = "prometheus-adapter"
GROUP = "custom.metrics.k8s.io"
VERSION = "v1beta1"
APISERVICE = f"{VERSION}.{GROUP}"
USER = IDENTITIES["metrics-adapter"][0]
FIELD_MANAGER = "kubeloop-dev"
# How often the adapter asks Prometheus which series exist: a Triton Pod
# started after the adapter has no metric until the next relist.
RELIST_INTERVAL = "10s"
_LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "kubeloop-dev"}


class MetricsAdapterError(RuntimeError):
    """The custom metrics API did not come up; the message carries the adapter's log."""


def render_rules(helm: Path, chart: Path, kube_version: str, rate_window: str | None = None) -> str:
    """The chart's prometheus-adapter rules (its ConfigMap's config.yaml),
    rendered with the values the chart requires and nothing else changed."""
    args = [str(helm), "template", "kubeloop", str(chart), "--namespace", NAMESPACE, "--kube-version", kube_version,
            "--show-only", "templates/prometheus-adapter.yaml", "--set", "metrics.prometheusAdapter.enabled=true",
            "--set", "pipelines.backend=noop", "--set", "webhooks.tokenSecret.name=unused",
            "--set", "mlflow.trackingUri=http://unused"]
    if rate_window:
        args += ["--set", f"metrics.prometheusAdapter.rateWindow={rate_window}"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise MetricsAdapterError(f"helm could not render the chart's adapter rules:\n{result.stderr}")
    [config_map] = [d for d in yaml.safe_load_all(result.stdout) if d]
    return config_map["data"]["config.yaml"]


def adapter_argv(adapter: Path, *, prometheus_url: str, rules: Path, port: int, cert: Path, key: Path,
                 kubeconfig: Path, cert_dir: Path) -> list[str]:
    """The adapter's command line: it serves on the node's address only, reads
    Prometheus, and delegates authentication and authorization to the API
    server with its own kubeconfig (no in-cluster configuration here)."""
    return [
        str(adapter), f"--prometheus-url={prometheus_url}", f"--config={rules}",
        f"--metrics-relist-interval={RELIST_INTERVAL}",
        f"--bind-address={NODE_IP}", f"--secure-port={port}",
        f"--tls-cert-file={cert}", f"--tls-private-key-file={key}", f"--cert-dir={cert_dir}",
        f"--lister-kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--v=1",
    ]


def build_objects(port: int, ca: bytes) -> list[dict]:
    """Everything the API server needs to serve custom.metrics.k8s.io through
    the adapter, in the order to apply it: the adapter's permissions, its
    Service and EndpointSlice (the node's address: a process, not a Pod), and
    the APIService trusting the adapter's serving CA. The HPA controller needs
    nothing more: the bootstrap policy lets its account read custom metrics."""
    rbac = "rbac.authorization.k8s.io"
    subject = [{"apiGroup": rbac, "kind": "User", "name": USER}]
    https = {"name": "https", "protocol": "TCP"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": _LABELS}},
        # Lists the Pods (and Namespaces) a request names, to query Prometheus for them.
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": USER, "labels": _LABELS},
         "rules": [{"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": USER, "labels": _LABELS},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": USER}, "subjects": subject},
        # TokenReviews and SubjectAccessReviews: who is asking, and may they.
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{USER}:auth-delegator", "labels": _LABELS},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:auth-delegator"}, "subjects": subject},
        # The front proxy's CA and allowed names (extension-apiserver-authentication).
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{USER}:auth-reader", "namespace": "kube-system", "labels": _LABELS},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "extension-apiserver-authentication-reader"},
         "subjects": subject},
        *node_service(NAME, NAMESPACE, _LABELS, [{**https, "port": 443, "targetPort": port}], [{**https, "port": port}]),
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": APISERVICE, "labels": _LABELS},
         "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 100, "versionPriority": 100,
                  "service": {"name": NAME, "namespace": NAMESPACE, "port": 443},
                  "caBundle": base64.b64encode(ca).decode()}},
    ]


def serving_names() -> list[str]:
    """The names the API server checks the adapter's certificate against."""
    return [f"{NAME}.{NAMESPACE}.svc", f"{NAME}.{NAMESPACE}"]


def install(platform, progress: Callable[[str], None] = lambda _: None,  # noqa: ANN001 - a Platform
            rate_window: str | None = None, timeout: float = 90) -> None:
    """Run prometheus-adapter against the platform's Prometheus and register
    it as the custom metrics API; returns once the API server reports the
    APIService Available (idempotent: a second call restarts the adapter)."""
    from kubeloop.dev.platform import write_kubeconfig

    state = platform.state()
    if not state or not state.real_node:
        raise MetricsAdapterError("the custom metrics API needs the real node: `kubeloop dev up --nodes real` first")
    adapter = ensure("adapter", progress)
    root = platform.dir / "metrics-adapter"
    root.mkdir(parents=True, exist_ok=True)
    rules = root / "config.yaml"
    rules.write_text(render_rules(binary("helm"), repo_root() / "charts" / "kubeloop",
                                  versions()["KUBERNETES_VERSION"], rate_window))
    kubeconfig = root / "adapter.kubeconfig"
    try:
        write_kubeconfig(kubeconfig, state.urls["KUBELOOP_APISERVER"], platform.pki, "metrics-adapter")
    except KeyError:
        raise MetricsAdapterError(f"the platform in {platform.dir} predates the adapter's identity:"
                                  " `kubeloop dev down` and up again") from None
    ca, cert, key = webhook_certificates(root / "pki", serving_names())
    (root / "tls.crt").write_bytes(cert)
    (root / "tls.key").write_bytes(key)
    (root / "tls.key").chmod(0o600)
    port = free_port()
    *objects, apiservice = build_objects(port, ca)
    kube = platform.kube()
    try:
        for obj in objects:
            kube.apply(obj, field_manager=FIELD_MANAGER)
        progress("starting prometheus-adapter")
        record = platform.start_process(PROCESS, adapter_argv(
            adapter, prometheus_url=f"{state.urls['PROMETHEUS_URL']}/", rules=rules, port=port,
            cert=root / "tls.crt", key=root / "tls.key", kubeconfig=kubeconfig, cert_dir=root / "certs"),
            # Nothing may fall back to the admin's kubeconfig the platform's environment names.
            env={"KUBECONFIG": str(kubeconfig)})
        kube.apply(apiservice, field_manager=FIELD_MANAGER)
        progress("waiting for the custom metrics API")
        _wait_available(kube, record, timeout)
    finally:
        kube.close()


def uninstall(platform) -> None:  # noqa: ANN001 - a Platform
    """Unregister the custom metrics API first (an APIService whose backend
    is gone stalls discovery, and with it namespace deletion and garbage
    collection), then stop the adapter and remove its objects."""
    kube = platform.kube()
    try:
        kube.delete("apiregistration.k8s.io/v1", "APIService", APISERVICE)
        platform.stop_process(PROCESS)
        for obj in reversed(build_objects(0, b"")[:-1]):
            if obj["kind"] != "Namespace":
                kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
    finally:
        kube.close()


def available(apiservice: dict | None) -> tuple[bool, str]:
    """The APIService's Available condition: (available, why not)."""
    conditions = {c["type"]: c for c in ((apiservice or {}).get("status") or {}).get("conditions") or []}
    found = conditions.get("Available", {})
    return found.get("status") == "True", f"{found.get('reason', 'no status yet')}: {found.get('message', '')}"


def _wait_available(kube: Kube, record: ProcessRecord, timeout: float) -> None:
    def done() -> bool:
        if not record.running():
            raise MetricsAdapterError(f"prometheus-adapter exited:\n{log_tail(record.log)}")
        return available(kube.get("apiregistration.k8s.io/v1", "APIService", APISERVICE))[0]

    def why() -> str:
        return available(kube.get("apiregistration.k8s.io/v1", "APIService", APISERVICE))[1]

    wait_for(done, timeout, f"the APIService {APISERVICE} Available", interval=0.5, seen=why,
             error=lambda message: MetricsAdapterError(f"{message}:\n{log_tail(record.log)}"))
