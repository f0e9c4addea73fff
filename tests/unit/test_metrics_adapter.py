"""The custom metrics API of the local platform (kubeloop.dev.metricsadapter)
and the aggregation layer it needs (kubeloop.dev.pki), as plain data: no
process runs here. tests/e2e/test_real_node.py proves the HPA scaling on it."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubeloop.dev import metricsadapter
from kubeloop.dev.binaries import GROUPS, binary, versions
from kubeloop.dev.pki import FRONT_PROXY_CLIENT, NODE_IP, create_pki, front_proxy_flags, webhook_certificates
from kubeloop.paths import repo_root
from tests.support.makefile import prebuild, prebuild_is_niced

CHART = repo_root() / "charts" / "kubeloop"


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(),
                               cert.signature_hash_algorithm)
    except Exception:  # noqa: BLE001 - cryptography's InvalidSignature, or a key of another kind
        return False
    return cert.issuer == ca.subject


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)


def test_the_front_proxy_shows_a_client_certificate_only_its_own_ca_signed_and_the_adapter_accepts(tmp_path):
    """The API server proxies to extension API servers with a client
    certificate they check against --requestheader-client-ca-file and
    --requestheader-allowed-names. That CA is not the cluster's: a client
    certificate the cluster CA signs (the kubelet client's, say) must not be
    able to claim any user in X-Remote-User."""
    pki = create_pki(tmp_path)
    flags = _flags(front_proxy_flags(pki))
    ca, client = _cert(Path(flags["requestheader-client-ca-file"])), _cert(Path(flags["proxy-client-cert-file"]))
    assert _signed_by(client, ca)
    assert not _signed_by(client, _cert(pki.ca_cert)) and ca.subject != _cert(pki.ca_cert).subject
    assert not _signed_by(_cert(pki.kubelet_client_cert), ca)
    [name] = client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert name.value == FRONT_PROXY_CLIENT == flags["requestheader-allowed-names"]
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert Path(flags["proxy-client-key-file"]).stat().st_mode & 0o077 == 0
    assert (flags["requestheader-username-headers"], flags["requestheader-group-headers"],
            flags["requestheader-extra-headers-prefix"]) == ("X-Remote-User", "X-Remote-Group", "X-Remote-Extra-")


def test_the_adapter_serves_on_the_node_address_only_and_delegates_auth_with_its_own_identity(tmp_path):
    argv = metricsadapter.adapter_argv(
        Path("/bin/adapter"), prometheus_url="http://127.0.0.1:9090/", rules=tmp_path / "config.yaml", port=16443,
        cert=tmp_path / "tls.crt", key=tmp_path / "tls.key", kubeconfig=tmp_path / "adapter.kubeconfig",
        cert_dir=tmp_path / "certs")
    flags = _flags(argv)
    assert (flags["bind-address"], flags["secure-port"]) == (NODE_IP, "16443")
    assert flags["prometheus-url"].startswith("http://127.0.0.1:")
    # Every API client of the adapter is its own identity's, never in-cluster or the admin's.
    for flag in ("lister-kubeconfig", "authentication-kubeconfig", "authorization-kubeconfig"):
        assert flags[flag] == str(tmp_path / "adapter.kubeconfig"), flag
    assert (flags["tls-cert-file"], flags["tls-private-key-file"]) == (str(tmp_path / "tls.crt"),
                                                                      str(tmp_path / "tls.key"))
    # A Triton Pod started after the adapter must get its metric within an HPA sync or two.
    assert flags["metrics-relist-interval"] == "10s"


def test_the_api_server_reaches_the_adapter_at_the_node_address_and_trusts_only_its_ca():
    """The aggregator (with --enable-aggregator-routing) resolves the
    APIService's Service port to the EndpointSlice port of the same name, and
    verifies the adapter's certificate against caBundle."""
    objects = {o["kind"] + "/" + o["metadata"]["name"]: o for o in metricsadapter.build_objects(16443, b"PEM")}
    apiservice = objects[f"APIService/{metricsadapter.APISERVICE}"]
    spec = apiservice["spec"]
    assert (spec["group"], spec["version"]) == ("custom.metrics.k8s.io", "v1beta1")
    assert apiservice["metadata"]["name"] == "v1beta1.custom.metrics.k8s.io"
    assert base64.b64decode(spec["caBundle"]) == b"PEM" and not spec.get("insecureSkipTLSVerify")
    service = objects[f"Service/{spec['service']['name']}"]
    assert service["metadata"]["namespace"] == spec["service"]["namespace"] and "selector" not in service["spec"]
    [port] = [p for p in service["spec"]["ports"] if p["port"] == spec["service"]["port"]]
    [endpoints] = [o for o in objects.values() if o["kind"] == "EndpointSlice"]
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == service["metadata"]["name"]
    assert endpoints["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert [(p["name"], p["port"]) for p in endpoints["ports"]] == [(port["name"], 16443)]
    assert [e["addresses"] for e in endpoints["endpoints"]] == [[NODE_IP]]
    assert list(objects)[-1] == f"APIService/{metricsadapter.APISERVICE}", "registered last, once its backend exists"


def test_the_adapter_may_delegate_auth_and_list_pods_and_nothing_more():
    objects = metricsadapter.build_objects(16443, b"PEM")
    bindings = {o["roleRef"]["name"]: o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")}
    assert set(bindings) == {"system:auth-delegator", "extension-apiserver-authentication-reader",
                             metricsadapter.USER}
    assert bindings["extension-apiserver-authentication-reader"]["metadata"]["namespace"] == "kube-system"
    assert all(b["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": metricsadapter.USER}] for b in bindings.values())
    [role] = [o for o in objects if o["kind"] == "ClusterRole"]
    assert {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]} == {("", r, v) for r in ("pods", "namespaces") for v in ("get", "list", "watch")}


def test_the_adapters_certificate_names_the_service_the_aggregator_dials(tmp_path):
    ca, cert, _key = webhook_certificates(tmp_path, metricsadapter.serving_names())
    leaf, root = x509.load_pem_x509_certificate(cert), x509.load_pem_x509_certificate(ca)
    assert _signed_by(leaf, root)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    # The aggregator's TLS server name for an APIService is <service>.<namespace>.svc.
    assert f"{metricsadapter.NAME}.{metricsadapter.NAMESPACE}.svc" in names


def test_the_platform_serves_the_charts_adapter_rules():
    """One source of rules: the platform renders the chart's ConfigMap (so
    tests/unit/test_chart.py's check that they serve the names the HPAs ask
    for holds for the platform too); the rate window is the chart's value."""
    rendered = metricsadapter.render_rules(binary("helm"), CHART, versions()["KUBERNETES_VERSION"])
    rules = yaml.safe_load(rendered)["rules"]
    assert {r["name"]["as"] for r in rules} == {"nv_inference_queue_duration_us_per_request",
                                                "nv_inference_request_success_per_second"}
    default = yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["prometheusAdapter"]["rateWindow"]
    assert all(f"[{default}]" in r["metricsQuery"] for r in rules)
    shorter = yaml.safe_load(metricsadapter.render_rules(binary("helm"), CHART, versions()["KUBERNETES_VERSION"],
                                                         rate_window="30s"))["rules"]
    assert all("[30s]" in r["metricsQuery"] and f"[{default}]" not in r["metricsQuery"] for r in shorter)


def test_the_adapter_is_pinned_once_and_built_in_make_tests_prebuild():
    """tools/versions.env pins it; the tools module requires that version
    (a bump in one place only would build another); make test builds it
    beside the unit tests, niced, as CoreDNS and KServe's manager."""
    group, key = GROUPS["adapter"]
    version = versions()[key]
    gomod = (repo_root() / "tools" / group / "go.mod").read_text()
    assert re.search(rf"^require sigs\.k8s\.io/prometheus-adapter {re.escape(version)}$", gomod, re.M), gomod[:200]
    assert f"\n    {group})" in (repo_root() / "tools" / "build-binaries.sh").read_text()
    assert prebuild_is_niced() and f" {group}" in prebuild().split(";")[0]
