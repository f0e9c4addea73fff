"""The real node: Debian's containerd and runc with the CNI bridge plugin,
and the kubelet and kube-proxy built from the control plane's Go module, all
rooted in the platform's state directory.

The settings that make it work on these machines: the kubelet accepts cgroup
v1 only with failCgroupV1 false (and the cgroupfs driver); runc cannot set a
negative oom_score_adj without CAP_SYS_RESOURCE, so containerd restricts it;
kube-proxy leaves conntrack sysctls alone. Every port binds the node address
(a bridge address that exists only here) or 127.0.0.1.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kubeloop.dev.dns import DNS_IP, DOMAIN
from kubeloop.dev.host import BRIDGE, NODE_CIDR, POD_CIDR
from kubeloop.dev.pki import NODE_IP, NODE_NAME, Pki
from kubeloop.paths import cache_dir

NODE_LABEL = "kubeloop.dev/node"
CNI_BIN = Path("/usr/lib/cni")
NEEDED = {"containerd": "containerd", "runc": "runc", "ctr": "containerd", "iptables": "iptables",
          "conntrack": "conntrack", "umoci": "umoci"}


SOCKET_PATH_MAX = 107
"""Bytes in a unix socket's path (sun_path holds 108 with its NUL)."""
KUBELET_SOCKET_NAME = 12
"""The longest name the kubelet binds in its pod-resources folder: its
kubelet.sock, and before that a random name of up to 10 digits."""


class NodeError(RuntimeError):
    """The real node cannot start; the message says what is missing."""


@dataclass(frozen=True)
class NodePaths:
    """Where the real node keeps its files, under the platform's state directory."""

    root: Path
    sockets: Path
    images: Path | None = None
    """containerd's root, where its images are unpacked, when it outlives the
    node (image_root()); under root otherwise."""

    @property
    def socket(self) -> Path:
        return self.sockets / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_resources(self) -> Path:
        """Where the kubelet binds its pod-resources socket: under its root,
        so a long state directory makes it too long to bind."""
        return self.kubelet_root / "pod-resources"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy-config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def kube_proxy_kubeconfig(self) -> Path:
        return self.root / "kube-proxy.kubeconfig"


def socket_path_problem(paths: NodePaths) -> str | None:
    """Why the kubelet could not bind its sockets under these paths, or None."""
    longest = len(os.fsencode(paths.pod_resources)) + 1 + KUBELET_SOCKET_NAME
    if longest <= SOCKET_PATH_MAX:
        return None
    return (f"the kubelet's sockets under {paths.pod_resources} would be {longest} bytes long, over the "
            f"{SOCKET_PATH_MAX} a unix socket's path may have: choose a --state-dir of at most "
            f"{len(os.fsencode(paths.root.parent)) - (longest - SOCKET_PATH_MAX)} bytes")


def missing_prerequisites() -> list[str]:
    """The Debian packages the real node needs that are not installed."""
    missing = {package for command, package in NEEDED.items() if shutil.which(command) is None}
    if not (CNI_BIN / "bridge").exists():
        missing.add("containernetworking-plugins")
    return sorted(missing)


def build_containerd_config(paths: NodePaths, pause_ref: str) -> str:
    """containerd's config (TOML, version 2): state, sockets, the runc root and
    the CRI plugin's CNI files all under paths.root."""
    base = paths.root / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join([
        "version = 2",
        f'root = "{paths.images or base / "root"}"',
        f'state = "{base / "state"}"',
        'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",'
        ' "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",'
        ' "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]',
        "[grpc]", f'  address = "{paths.socket}"',
        "[ttrpc]", f'  address = "{paths.sockets / "containerd.ttrpc.sock"}"',
        '[plugins."io.containerd.internal.v1.opt"]', f'  path = "{base / "opt"}"',
        f"[{cri}]",
        f'  sandbox_image = "{pause_ref}"',
        # Without CAP_SYS_RESOURCE runc cannot lower oom_score_adj below ours.
        "  restrict_oom_score_adj = true",
        '  stream_server_address = "127.0.0.1"', '  stream_server_port = "0"',
        "  enable_selinux = false",
        f"[{cri}.containerd]", '  snapshotter = "overlayfs"', '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]", '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]", "  SystemdCgroup = false",
        f'  Root = "{base / "runc"}"',
        f"[{cri}.cni]", f'  bin_dir = "{CNI_BIN}"', f'  conf_dir = "{paths.cni_conf_dir}"',
        "", ])


def build_cni_config(paths: NodePaths) -> dict:
    """One bridge network for the node's Pods, gateway = the node address; no
    masquerading and no host ports (nothing of a Pod's is reachable from or
    sent beyond this machine)."""
    return {
        "cniVersion": "0.4.0", "name": "kubeloop",
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(paths.root / "cni" / "ipam"),
                     "ranges": [[{"subnet": NODE_CIDR, "gateway": NODE_IP}]],
                     "routes": [{"dst": "0.0.0.0/0"}]},
        }],
    }


def build_kubelet_config(paths: NodePaths, pki: Pki) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # These VMs run cgroup v1, which the kubelet refuses unless told.
        "failCgroupV1": False, "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "address": NODE_IP, "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "tlsCertFile": str(pki.kubelet_cert), "tlsPrivateKeyFile": str(pki.kubelet_key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki.ca_cert)}},
        "authorization": {"mode": "Webhook"},
        "clusterDomain": DOMAIN, "clusterDNS": [DNS_IP],
        "resolvConf": str(paths.root / "resolv.conf"),
        "podLogsDir": str(paths.root / "pod-logs"),
        "volumePluginDir": str(paths.root / "volume-plugins"),
        "failSwapOn": False,
        # Images cannot be pulled again here, so the kubelet never collects them.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        # A shared machine's disk and memory are not this node's to guard.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False,
        # A router Pod reads its routes from a ConfigMap volume, which the kubelet
        # refreshes on each Pod sync: at the default minute a promotion took
        # over two minutes to reach the callers of a loaded two-core node.
        "syncFrequency": "10s",
        "maxPods": 110,
    }


def build_kube_proxy_config(paths: NodePaths) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "mode": "iptables", "hostnameOverride": NODE_NAME, "clusterCIDR": POD_CIDR,
        "clientConnection": {"kubeconfig": str(paths.kube_proxy_kubeconfig)},
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
        # NodePorts answer on loopback only.
        "nodePortAddresses": ["127.0.0.0/8"],
        # Zero leaves the host's conntrack sysctls as they are.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def kubelet_argv(kubelet: Path, paths: NodePaths) -> list[str]:
    return [str(kubelet), f"--config={paths.kubelet_config}", f"--kubeconfig={paths.kubelet_kubeconfig}",
            f"--root-dir={paths.kubelet_root}", f"--node-ip={NODE_IP}", f"--hostname-override={NODE_NAME}",
            f"--node-labels={NODE_LABEL}=real", "--v=1"]


def write_configs(paths: NodePaths, pki: Pki, pause_ref: str) -> None:
    import yaml

    for folder in (paths.cni_conf_dir, paths.containerd_config.parent, paths.sockets):
        folder.mkdir(parents=True, exist_ok=True)
    paths.containerd_config.write_text(build_containerd_config(paths, pause_ref))
    (paths.cni_conf_dir / "10-kubeloop.conflist").write_text(json.dumps(build_cni_config(paths), indent=2))
    paths.kubelet_config.write_text(yaml.safe_dump(build_kubelet_config(paths, pki)))
    paths.kube_proxy_config.write_text(yaml.safe_dump(build_kube_proxy_config(paths)))
    # Pods with dnsPolicy Default get no nameserver: nothing asks the host's resolver.
    (paths.root / "resolv.conf").write_text("options ndots:1\n")


def ctr(paths: NodePaths, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", f"--address={paths.socket}", "--namespace=k8s.io", *args],
                          capture_output=True, text=True, timeout=timeout)


@functools.cache  # node_paths asks at every ctr call; containerd's version does not change under a process
def image_root() -> Path | None:
    """containerd's root kept between real nodes (one at a time on a
    machine), keyed by containerd's version: kubeloop's images, unpacked once,
    need not be imported again (the training image, torch, took two minutes
    of each node's start). None without containerd (`dev up` then says
    what to install)."""
    if shutil.which("containerd") is None:
        return None
    words = subprocess.run(["containerd", "--version"], capture_output=True, text=True, timeout=30).stdout.split()
    return cache_dir() / f"containerd-{words[2] if len(words) > 2 else 'unknown'}"


KEPT_IMAGES_MAX_BYTES = 24 * 2**30
"""A kept root past this (images of builds replaced since) starts again empty."""


def bound_image_root(root: Path, limit: int = KEPT_IMAGES_MAX_BYTES) -> int:
    """Empty a kept root that has grown past limit, before containerd opens
    it; the bytes dropped (0 when it was kept)."""
    used = subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True, timeout=300).stdout.split()
    size = int(used[0]) if used else 0
    if size <= limit:
        return 0
    shutil.rmtree(root, ignore_errors=True)
    return size


def forget_containers(paths: NodePaths) -> list[str]:
    """Remove the containers (Pod sandboxes among them) an earlier node left
    in a kept root, before the kubelet starts: their Pods are gone with that
    node's cluster. The names removed."""
    return [name for name in containers(paths) if ctr(paths, "containers", "delete", name, timeout=60).returncode == 0]


def containers(paths: NodePaths) -> list[str]:
    """The names of the containers containerd holds (its root's, whichever node made them)."""
    return ctr(paths, "containers", "list", "--quiet", timeout=60).stdout.split()


def containerd_ready(paths: NodePaths) -> bool:
    try:
        return ctr(paths, "version", timeout=5).returncode == 0 and cri_ready(paths)
    except subprocess.TimeoutExpired:  # the socket is there before the server answers
        return False


CRI_VERSION = "/runtime.v1.RuntimeService/Version"


def cri_ready(paths: NodePaths) -> bool:
    """Whether containerd's CRI plugin answers the kubelet's first call. It
    starts after containerd answers ctr, once it has recovered the kept
    root's containers, and until then answers `server is not initialized
    yet`: a kubelet started then exits (seen on a kept root of 13 GiB)."""
    import grpc

    with grpc.insecure_channel(f"unix://{paths.socket}") as channel:
        version = channel.unary_unary(CRI_VERSION, request_serializer=bytes, response_deserializer=bytes)
        try:
            version(b"", timeout=5)  # an empty VersionRequest
        except grpc.RpcError:
            return False
    return True


IMPORT_MIN_SECONDS = 300
IMPORT_MIN_BYTES_PER_SECOND = 4 * 2**20
"""The slowest unpacking an import is given time for: the training image
(3.1 GiB, torch) imported into an empty root on two cores busy with tests
ran past 300 s, where an idle machine takes about 120 s."""


def import_timeout(size: int) -> float:
    """Seconds an import of an archive of size bytes may take."""
    return max(IMPORT_MIN_SECONDS, size / IMPORT_MIN_BYTES_PER_SECOND)


def import_image(paths: NodePaths, archive: Path, ref: str) -> None:
    """Import an OCI archive into the node's containerd as ref (unpacked for the snapshotter)."""
    base = ref.rsplit(":", 1)[0]
    size = archive.stat().st_size
    timeout = import_timeout(size)
    try:
        result = ctr(paths, "images", "import", f"--base-name={base}", "--digests", str(archive), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NodeError(f"ctr images import {archive} took over {timeout:.0f} s for "
                        f"{size / 2**30:.1f} GiB (slower than "
                        f"{IMPORT_MIN_BYTES_PER_SECOND / 2**20:.0f} MiB/s): the disk or the machine is too busy") from None
    if result.returncode != 0:
        raise NodeError(f"ctr images import {archive} failed: {result.stderr.strip()}")


def has_image(paths: NodePaths, ref: str) -> bool:
    result = ctr(paths, "images", "list", "--quiet", f"name=={ref}", timeout=30)
    return ref in result.stdout.split()
