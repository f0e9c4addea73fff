"""Cluster DNS for the real node's Pods: CoreDNS (built from its Go module,
see tools/coredns) runs beside the kubelet on the node's address, behind the
kube-dns Service at the address the kubelet hands to every Pod.

It answers for cluster.local (and reverse lookups of cluster addresses) and
for nothing else: it has no upstream, so no name a Pod asks is sent beyond
this machine. It reads Services and EndpointSlices as a user of its own,
allowed exactly that.
"""

from __future__ import annotations

from pathlib import Path

from kubeloop.dev.pki import IDENTITIES, NODE_IP

# The address kubeadm gives cluster DNS: the tenth of the Service range.
DNS_IP = "10.96.0.10"
DOMAIN = "cluster.local"
USER = IDENTITIES["coredns"][0]
NAMESPACE = "kube-system"
SERVICE = "kube-dns"
_PORTS = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]


def build_corefile(kubeconfig: Path, ready_port: int) -> str:
    """One server for the cluster's zones; every other name gets REFUSED at
    once from a server with no plugins (not logged: a Pod retrying an outside
    name would fill the log)."""
    return "\n".join([
        f"{DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{",
        f"    bind {NODE_IP}",
        "    errors",
        f"    ready 127.0.0.1:{ready_port}",
        f"    kubernetes {DOMAIN} in-addr.arpa ip6.arpa {{",
        f"        kubeconfig {kubeconfig} kubeloop",
        "        pods insecure",
        "        fallthrough in-addr.arpa ip6.arpa",
        "    }",
        "    cache 30",
        "    loadbalance",
        "}",
        ".:53 {",
        f"    bind {NODE_IP}",
        "}",
        "",
    ])


def build_objects() -> list[dict]:
    """The RBAC that lets CoreDNS read what it answers from, and the kube-dns
    Service with an EndpointSlice pointing at the node's address (CoreDNS is
    a process on the node, not a Pod, so no selector could find it)."""
    rules = [
        {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
    labels = {"app.kubernetes.io/name": "coredns", "app.kubernetes.io/managed-by": "kubeloop-dev"}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": USER, "labels": labels}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": USER, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]},
        *node_service(SERVICE, NAMESPACE, labels, [{**p, "targetPort": 53} for p in _PORTS], _PORTS, DNS_IP),
    ]


def node_service(name: str, namespace: str, labels: dict, service_ports: list[dict], endpoint_ports: list[dict],
                 cluster_ip: str | None = None) -> list[dict]:
    """A Service for a process that listens on the node's address (CoreDNS,
    prometheus-adapter): no selector, and an EndpointSlice naming the node's
    address, its ports matched to the Service's by name."""
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace, "labels": labels},
         "spec": {**({"clusterIP": cluster_ip} if cluster_ip else {}), "ports": service_ports}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{name}-node", "namespace": namespace,
                      "labels": {**labels, "kubernetes.io/service-name": name,
                                 "endpointslice.kubernetes.io/managed-by": "kubeloop-dev"}},
         "addressType": "IPv4", "ports": endpoint_ports,
         "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}]},
    ]


def coredns_argv(coredns: Path, corefile: Path) -> list[str]:
    return [str(coredns), "-conf", str(corefile)]
