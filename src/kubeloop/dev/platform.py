"""The local platform: a real Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) with KWOK faking a GPU fleet, an
MLflow tracking server keeping its artifacts in an S3 object store
(SeaweedFS, kubeloop.dev.objectstore), a Feast repository, and Prometheus and
Alertmanager (Debian's) with kubeloop's rules, run as background processes on 127.0.0.1
from a state directory. With `real_node`, one real node (containerd, kubelet,
kube-proxy; see kubeloop.dev.node) with cluster DNS (kubeloop.dev.dns) runs Pods beside the fake GPU fleet and
takes the place of the fleet's CPU-only nodes.

`up` is idempotent: a platform whose processes all run is left alone, one that
is half dead is torn down and started again. `down` stops every process `up`
started, undoes what the real node changed on the host, and removes the
state directory.
"""

from __future__ import annotations

import base64
import json
from importlib import resources
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil
import yaml

from kubeloop.api.resources import KINDS, build_crd
from kubeloop import processes
from kubeloop.dev import dns, host, node, objectstore, onlinestore
from kubeloop.dev.binaries import binary, ensure
from kubeloop.dev.fleet import DEFAULT_FLEET, build_nodes, build_resource_slices, load_fleet
from kubeloop.dev.host import SERVICE_CIDR
from kubeloop.dev.images import Image, pause_image
from kubeloop.dev.onlinestore import OnlineStoreKind
from kubeloop.gpu.dra import device_classes
from kubeloop.dev.pki import IDENTITIES, NODE_IP, NODE_NAME, Pki, create_pki, front_proxy_flags
from kubeloop.kube import Kube, KubeError
from kubeloop.polling import wait_for

Progress = Callable[[str], None]
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
AUDIT_POLICY = Path(__file__).with_name("audit-policy.yaml")
CORE = ("etcd", "seaweedfs", "mlflow", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
        "mig-manager", "prometheus", "alertmanager", "redis")
NODE_PROCESSES = ("containerd", "kubelet", "kube-proxy", "coredns", "pod-targets")
RULES = Path(str(resources.files("kubeloop.monitoring") / "rules"))
# KWOK's fake Pods take addresses from the lower half of the Pod range; the
# real node's bridge subnet (host.NODE_CIDR) lies in the upper half.
KWOK_CIDR = "10.244.0.0/17"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME", str(Path.home() / ".local" / "state"))
    return Path(os.environ.get("KUBELOOP_STATE_DIR", Path(base) / "kubeloop" / "dev"))


@dataclass
class PlatformState:
    """What `up` started, as written to state.json."""

    ports: dict[str, int] = field(default_factory=dict)
    processes: list[processes.ProcessRecord] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    ready_seconds: float = 0.0
    real_node: bool = False
    online_store: str = OnlineStoreKind.sqlite.value

    def to_json(self) -> str:
        return json.dumps({
            "ports": self.ports, "urls": self.urls, "started_at": self.started_at,
            "ready_seconds": self.ready_seconds, "real_node": self.real_node, "online_store": self.online_store,
            "processes": [p.to_dict() for p in self.processes],
        }, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "PlatformState":
        data = json.loads(text)
        return cls(ports=data["ports"], urls=data["urls"], started_at=data["started_at"],
                   ready_seconds=data.get("ready_seconds", 0.0), real_node=data.get("real_node", False),
                   online_store=data.get("online_store", OnlineStoreKind.sqlite.value),
                   processes=[processes.ProcessRecord(**p) for p in data["processes"]])


class PlatformError(RuntimeError):
    """The platform could not be brought up; the message carries the log tail."""


class NodeBusy(PlatformError):
    """Another platform's real node runs on this machine (one fits)."""


class Platform:
    """The local platform rooted at one state directory."""

    def __init__(self, state_dir: Path | None = None, fleet_file: Path = DEFAULT_FLEET, real_node: bool = False,
                 online_store: OnlineStoreKind = OnlineStoreKind.sqlite):
        self.dir = Path(state_dir or default_state_dir()).absolute()
        self.fleet_file = fleet_file
        self.real_node = real_node
        self.online_store = OnlineStoreKind(online_store)

    # -- paths -------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def audit_log(self) -> Path:
        """JSON lines: the API requests of ServiceAccounts (see audit-policy.yaml)."""
        return self.logs / "audit.log"

    @property
    def s3_identities(self) -> Path:
        """The object store's identities file: the platform's S3 access key (mode 0600)."""
        return self.dir / "objectstore" / "identities.json"

    @property
    def pki(self) -> Pki:
        return Pki(self.dir / "pki")

    @property
    def host_address(self) -> str:
        """Where the API server and MLflow listen: loopback, or with the real
        node its address (on this machine only), so that Pods reach them too."""
        return NODE_IP if self.real_node else "127.0.0.1"

    @property
    def node_paths(self) -> node.NodePaths:
        return node.NodePaths(self.dir / "node", host.socket_dir(self.dir), node.image_root())

    def state(self) -> PlatformState | None:
        if not self.state_file.exists():
            return None
        return PlatformState.from_json(self.state_file.read_text())

    # -- lifecycle ---------------------------------------------------------

    def running(self) -> bool:
        """Whether every process `up` started still runs (the operator and other
        processes started later may come and go)."""
        state = self.state()
        core = [p for p in state.processes if p.name in CORE + NODE_PROCESSES] if state else []
        return bool(core) and all(p.running() for p in core)

    def up(self, progress: Progress = lambda _: None) -> PlatformState:
        if self.running():
            if self.state().real_node != self.real_node:
                raise PlatformError(f"the platform in {self.dir} is up {'with' if self.state().real_node else 'without'}"
                                    " a real node; `kubeloop dev down` first to change that")
            if self.state().online_store != self.online_store.value:
                raise PlatformError(f"the platform in {self.dir} keeps online features in {self.state().online_store};"
                                    " `kubeloop dev down` first to change that")
            progress("the platform is already up")
            return self.state()
        if self.real_node and (problem := node.socket_path_problem(self.node_paths)):
            raise PlatformError(problem)
        if self.dir.exists():
            progress("clearing a stale platform state")
            self.down()
        if self.real_node:
            self._claim_host(progress)
        started = time.monotonic()
        state = PlatformState(started_at=time.time(), real_node=self.real_node, online_store=self.online_store.value)
        try:
            if self.real_node:  # first: the servers bind the node's address
                host.prepare(self.dir)
            self._start_control_plane(state, progress)
            if self.real_node:
                self._start_node(state, progress)
            self._install(state, progress)
        except BaseException:
            self._save(state)
            self.down()
            raise
        state.ready_seconds = round(time.monotonic() - started, 1)
        self._save(state)
        progress(f"platform ready in {state.ready_seconds} s")
        return state

    def down(self) -> None:
        state = self.state()
        if state:
            for record in reversed(state.processes):
                _stop(record)
            for path in objectstore.grpc_socket_files(state.ports):
                path.unlink(missing_ok=True)
        claim = host.Claim.read()
        if claim and Path(claim.state_dir) == self.dir:
            host.clean(self.dir, claim)
        # What the operator started under its work folder here (Triton servers,
        # routers, pipeline workers) runs in sessions of its own: stop it too
        # (after the node's mounts are gone, so the walk stays in this folder).
        if self.dir.exists():
            processes.stop_all_under(self.dir)
        # Never delete through a mount (a container's bind mount could reach anywhere);
        # another platform's network namespaces are not in the way.
        left = [m for m in host.mounts(self.dir) if m == self.dir or self.dir in m.parents]
        if left:
            raise PlatformError(f"{self.dir} still has mounts ({', '.join(map(str, left[:3]))}); not removing it")
        shutil.rmtree(self.dir, ignore_errors=True)

    def status(self) -> dict[str, dict]:
        state = self.state()
        if not state:
            return {}
        return {p.name: {"running": p.running(), "pid": p.pid, "log": p.log}
                for p in state.processes}

    def node_status(self) -> dict | None:
        """The real node's Ready condition, None without one."""
        state = self.state()
        if not state or not state.real_node:
            return None
        try:
            found = self.kube().get("v1", "Node", NODE_NAME) or {}
        except (KubeError, OSError) as exc:
            return {"name": NODE_NAME, "ready": False, "message": str(exc)}
        return {"name": NODE_NAME, **_node_ready(found)}

    def env(self) -> dict[str, str]:
        state = self.state()
        if not state:
            return {}
        out = {"KUBECONFIG": str(self.kubeconfig)}
        out.update({name: url for name, url in state.urls.items()})
        out.update(objectstore.env(_s3_endpoint(state), objectstore.read_credentials(self.s3_identities)))
        return out

    def tool_path(self) -> str:
        """PATH with the pinned kubectl and helm first."""
        dirs = [str(binary("kubectl").parent), str(binary("helm").parent)]
        return ":".join(dirs + [os.environ.get("PATH", "")])

    def kube(self) -> Kube:
        return Kube.from_kubeconfig(str(self.kubeconfig))

    def install_crds(self) -> None:
        """Apply the CRDs of this checkout's API (also to a platform already up)."""
        kube = self.kube()
        for kind in KINDS:
            kube.apply(build_crd(kind), field_manager="kubeloop-dev")

    def import_image(self, image: Image) -> None:
        """Make a locally built image available to the real node's Pods
        (which use it with imagePullPolicy Never)."""
        state = self.state()
        if not state or not state.real_node:
            raise PlatformError(f"the platform in {self.dir} has no real node to import {image.ref} into")
        if not node.has_image(self.node_paths, image.ref):
            node.import_image(self.node_paths, image.archive, image.ref)

    def start_process(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> processes.ProcessRecord:
        """Start (or restart) a process that `down` will stop with the rest,
        such as the operator in `kubeloop demo`."""
        state = self.state()
        if state is None:
            raise PlatformError("the platform is not up")
        self.stop_process(name)
        state = self.state()
        record = processes.start(name, argv, self.logs, env={**self.env(), **(env or {})}, cwd=self.dir)
        state.processes.append(record)
        self._save(state)
        return record

    def restart_process(self, name: str, stopped: Callable[[], None] = lambda: None) -> processes.ProcessRecord:
        """Stop one of the platform's processes and start it again as it was
        (same command line, environment and folder), for outage drills;
        stopped() runs while it is down."""
        state = self.state()
        record = next((p for p in state.processes if p.name == name), None) if state else None
        if record is None or not record.running():
            raise PlatformError(f"{name} is not running")
        proc = psutil.Process(record.pid)
        argv, env, cwd = proc.cmdline(), proc.environ(), proc.cwd()
        _stop(record)
        try:
            stopped()
        finally:
            fresh = processes.start(name, argv, self.logs, env=env, cwd=Path(cwd))
            state = self.state()
            state.processes = [fresh if p.name == name else p for p in state.processes]
            self._save(state)
        return fresh

    def stop_process(self, name: str) -> None:
        state = self.state()
        if state is None:
            return
        for record in [p for p in state.processes if p.name == name]:
            _stop(record)
        state.processes = [p for p in state.processes if p.name != name]
        self._save(state)

    # -- steps -------------------------------------------------------------

    def _start_control_plane(self, state: PlatformState, progress: Progress) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        pki = create_pki(self.dir / "pki")
        ports = state.ports
        for name in ("etcd", "etcd-peer", "apiserver", "mlflow", "prometheus", "alertmanager", *objectstore.PORTS):
            ports[name] = processes.free_port()
        # With the real node, the chart's operator Pod takes the operator's port on loopback through a
        # NodePort Service, where Alertmanager and MLflow already call it (kubeloop.story.cluster).
        ports["operator"] = processes.free_port(node_port=self.real_node)
        api = f"https://{self.host_address}:{ports['apiserver']}"
        for identity in ("admin", "controller-manager", "scheduler", "kwok"):
            name = "kubeconfig" if identity == "admin" else f"{identity}.kubeconfig"
            write_kubeconfig(self.dir / name, api, pki, identity)

        progress("starting etcd")
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        self._spawn(state, "etcd", [
            str(binary("etcd")), "--name=kubeloop", f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
            f"--initial-cluster=kubeloop=http://127.0.0.1:{ports['etcd-peer']}",
            "--unsafe-no-fsync", "--quota-backend-bytes=4294967296", "--log-level=warn",
        ])
        self._start_objectstore(state)
        self._start_mlflow(state)
        self._start_featurestore(state)
        self._start_monitoring(state, pki)
        self._wait(state, "etcd", lambda: _http_ok(f"{etcd_url}/health"), 30)

        progress("starting kube-apiserver")
        self._spawn(state, "kube-apiserver", [
            str(binary("kube-apiserver")), f"--etcd-servers={etcd_url}",
            f"--bind-address={self.host_address}", f"--advertise-address={self.host_address}",
            f"--secure-port={ports['apiserver']}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}", f"--token-auth-file={pki.token_file}",
            "--authorization-mode=Node,RBAC", f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            # Node names do not resolve here; the real node's address does.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.service_account_key}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            # Pods on the real node get their ServiceAccount's token; KWOK's
            # Pods need none (and need not wait for the namespace's account).
            *([] if self.real_node else ["--disable-admission-plugins=ServiceAccount"]),
            # The loopback address may not be an Endpoints IP: without the real
            # node nothing reaches the API server through the kubernetes Service.
            f"--endpoint-reconciler-type={'lease' if self.real_node else 'none'}",
            # Admission webhooks served by Pods (KServe's) are called at a
            # Pod's address: Service addresses are blackholed on the host, and
            # kube-proxy's rules apply only after the host's routing.
            *(["--enable-aggregator-routing=true"] if self.real_node else []),
            # The aggregation layer (kubeloop.dev.metricsadapter's custom metrics API).
            *front_proxy_flags(pki),
            f"--audit-policy-file={AUDIT_POLICY}", f"--audit-log-path={self.audit_log}",
            "--audit-log-maxsize=100", "--audit-log-maxbackup=1",
            "--profiling=false", "--v=0",
        ])
        kube = self.kube()
        self._wait(state, "kube-apiserver", kube.healthy, 60)

        progress("starting kube-controller-manager, kube-scheduler and KWOK")
        self._spawn(state, "kube-controller-manager", [
            str(binary("kube-controller-manager")),
            f"--kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
            "--secure-port=0", "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca_cert}", "--cluster-name=kubeloop",
            "--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
            "--node-monitor-grace-period=60s", "--v=0",
        ])
        self._spawn(state, "kube-scheduler", [
            str(binary("kube-scheduler")), f"--kubeconfig={self.dir / 'scheduler.kubeconfig'}",
            "--secure-port=0", "--leader-elect=false", "--v=0",
        ])
        self._spawn(state, "kwok", [
            str(binary("kwok")), f"--kubeconfig={self.dir / 'kwok.kubeconfig'}",
            f"--config={KWOK_STAGES}", "--node-lease-duration-seconds=40",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--cidr={KWOK_CIDR}", "--node-ip=10.0.0.1",
        ], cwd=self.dir)
        state.urls["KUBELOOP_APISERVER"] = api

    def _install(self, state: PlatformState, progress: Progress) -> None:
        kube = self.kube()
        progress("installing the kubeloop CRDs")
        self.install_crds()
        progress("registering the fake GPU fleet")
        fleet = load_fleet(self.fleet_file)
        if self.real_node:  # the real node carries the CPU work
            fleet = fleet.model_copy(update={"nodes": [n for n in fleet.nodes if n.gpu]})
        for fake in build_nodes(fleet):
            # Created with its status in one request, as a kubelet registers a
            # node, so KWOK never sees a node without capacity.
            kube.create(fake)
        # The same GPUs as Dynamic Resource Allocation publishes them.
        for obj in device_classes() + build_resource_slices(fleet.nodes):
            kube.apply(obj, field_manager="kubeloop-dev")
        if self.real_node:  # Prometheus scrapes the real node's Pods that ask for it
            for obj in prometheus_rbac():
                kube.apply(obj, field_manager="kubeloop-dev")
            kubeconfig = self.dir / "prometheus.kubeconfig"
            write_kubeconfig(kubeconfig, state.urls["KUBELOOP_APISERVER"], self.pki, "prometheus")
            self._spawn(state, "pod-targets", [
                sys.executable, "-m", "kubeloop.dev.podtargets", f"--kubeconfig={kubeconfig}",
                f"--output={self.dir / 'monitoring' / 'targets' / 'pods.json'}", f"--node={NODE_NAME}"])
        # Re-partitions a fake MIG node when its nvidia.com/mig.config label changes.
        self._spawn(state, "mig-manager", [sys.executable, "-m", "kubeloop.dev.migmanager",
                                           f"--kubeconfig={self.dir / 'kwok.kubeconfig'}",
                                           f"--fleet={self.fleet_file}"])

        def crds_established() -> bool:
            for kind in KINDS:
                crd = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", kind.crd_name)
                conditions = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions", [])}
                if conditions.get("Established") != "True":
                    return False
            return True

        def nodes_ready() -> bool:
            return all(_node_ready(found)["ready"] and found["status"].get("allocatable")
                       for found in kube.list("v1", "Node"))

        def controllers_running() -> bool:
            return kube.get("v1", "ServiceAccount", "default", "default") is not None

        self._wait(state, "kube-apiserver", crds_established, 30)
        if self.real_node:
            self._wait(state, "kubelet", lambda: _node_ready(kube.get("v1", "Node", NODE_NAME) or {})["ready"], 60)
            ready = f"http://127.0.0.1:{state.ports['coredns-ready']}/ready"
            self._wait(state, "coredns", lambda: _http_ok(ready), 30)
        self._wait(state, "kwok", nodes_ready, 30)
        self._wait(state, "kube-controller-manager", controllers_running, 30)
        progress("creating the object store's buckets")
        credentials = objectstore.read_credentials(self.s3_identities)
        self._wait(state, "seaweedfs", lambda: objectstore.answering(_s3_endpoint(state), credentials), 30)
        objectstore.ensure_buckets(_s3_endpoint(state), credentials)
        progress("waiting for MLflow")
        self._wait(state, "mlflow", lambda: _http_ok(f"{state.urls['MLFLOW_TRACKING_URI']}/health"), 60)
        progress("waiting for Prometheus and Alertmanager")
        self._wait(state, "prometheus", lambda: _http_ok(f"{state.urls['PROMETHEUS_URL']}/-/ready"), 60)
        self._wait(state, "alertmanager", lambda: _http_ok(f"{state.urls['ALERTMANAGER_URL']}/-/ready"), 60)
        progress("waiting for the feature repository")
        self._wait_job(state, "featurestore", 120)

    def _claim_host(self, progress: Progress) -> None:
        """Make sure no other real node runs on this machine; clean up what a
        real node that did not stop cleanly left behind."""
        claim = host.Claim.read()
        if claim and Path(claim.state_dir) != self.dir:
            owner = Platform(Path(claim.state_dir))
            if owner.running():
                raise NodeBusy(
                    f"a real node of the platform in {claim.state_dir} is running, and one machine takes one real"
                    f" node: stop it with `kubeloop dev down --state-dir {claim.state_dir}`, or start this"
                    " platform without --nodes real")
            progress(f"cleaning up the real node left behind in {claim.state_dir}")
            owner.down()
        claim = host.Claim.read()
        owner_dir = Path(claim.state_dir) if claim else None
        left = [kind for kind, items in host.leftovers(owner_dir).items() if items]
        if left:
            progress(f"cleaning up what an earlier real node left: {', '.join(left)}")
            host.clean(owner_dir, claim)
        missing = node.missing_prerequisites()
        if missing:
            raise PlatformError(f"the real node needs Debian's {', '.join(missing)}: run `make setup`")

    def _start_node(self, state: PlatformState, progress: Progress) -> None:
        """containerd, the kubelet and kube-proxy, on a bridge of their own."""
        progress("starting the real node (containerd, kubelet, kube-proxy)")
        paths, pki = self.node_paths, self.pki
        pause = pause_image()
        node.write_configs(paths, pki, pause.ref)
        api = state.urls["KUBELOOP_APISERVER"]
        for identity, path in (("node", paths.kubelet_kubeconfig), ("kube-proxy", paths.kube_proxy_kubeconfig)):
            write_kubeconfig(path, api, pki, identity)
        if paths.images and paths.images.exists() and (dropped := node.bound_image_root(paths.images)):
            progress(f"emptied {paths.images}: its images took {dropped / 2**30:.1f} GiB, over"
                     f" {node.KEPT_IMAGES_MAX_BYTES / 2**30:.0f} GiB; they are imported again as Pods need them")
        self._spawn(state, "containerd", ["containerd", f"--config={paths.containerd_config}"])
        self._wait(state, "containerd", lambda: node.containerd_ready(paths), 30)
        left = node.forget_containers(paths)
        if left:
            progress(f"removed {len(left)} containers an earlier real node left in {paths.images}")
        if not node.has_image(paths, pause.ref):
            node.import_image(paths, pause.archive, pause.ref)
        self._spawn(state, "kubelet", node.kubelet_argv(binary("kubelet"), paths))
        self._spawn(state, "kube-proxy", [str(binary("kube-proxy")), f"--config={paths.kube_proxy_config}"])
        self._start_dns(state, progress)

    def _start_dns(self, state: PlatformState, progress: Progress) -> None:
        """CoreDNS on the node's address behind the kube-dns Service."""
        coredns = ensure("coredns", progress)
        progress("starting CoreDNS")
        kube, root = self.kube(), self.node_paths.root

        def applied() -> bool:  # kube-system appears moments after the API server answers
            for obj in dns.build_objects():
                kube.apply(obj, field_manager="kubeloop-dev")
            return True

        self._wait(state, "kube-apiserver", applied, 30)
        kubeconfig = root / "coredns.kubeconfig"
        write_kubeconfig(kubeconfig, state.urls["KUBELOOP_APISERVER"], self.pki, "coredns")
        state.ports["coredns-ready"] = processes.free_port()
        corefile = root / "Corefile"
        corefile.write_text(dns.build_corefile(kubeconfig, state.ports["coredns-ready"]))
        self._spawn(state, "coredns", dns.coredns_argv(coredns, corefile))

    def _start_monitoring(self, state: PlatformState, pki: Pki) -> None:
        """Prometheus with kubeloop's rules, scraping what registers itself
        under prometheus/targets; Alertmanager sending retrain alerts to the
        operator's webhook (at a port reserved for it) with a bearer token."""
        ports = state.ports
        root = self.dir / "monitoring"
        targets = root / "targets"
        targets.mkdir(parents=True, exist_ok=True)
        # One secret per purpose: Alertmanager's bearer token, MLflow's signing secret.
        token, signing = pki.dir / "webhook-token", pki.dir / "mlflow-webhook-secret"
        for path in (token, signing):
            path.write_text(secrets.token_urlsafe(32))
            path.chmod(0o600)
        operator = f"127.0.0.1:{ports['operator']}"
        (targets / "operator.json").write_text(json.dumps([{"targets": [operator], "labels": {"job": "kubeloop-operator"}}]))
        prometheus_config = build_prometheus_config(RULES, targets, ports["alertmanager"])
        (root / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config, sort_keys=False))
        (root / "alertmanager.yml").write_text(yaml.safe_dump(
            build_alertmanager_config(f"http://{operator}/hooks/alertmanager", token), sort_keys=False))
        self._spawn(state, "prometheus", [
            shutil.which("prometheus") or "/usr/bin/prometheus", f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'prometheus-data'}", f"--web.listen-address={self.host_address}:{ports['prometheus']}",
            "--web.enable-lifecycle", "--storage.tsdb.retention.time=1d", "--log.level=warn",
        ])
        self._spawn(state, "alertmanager", [
            shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager",
            f"--config.file={root / 'alertmanager.yml'}", f"--storage.path={root / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{ports['alertmanager']}", "--cluster.listen-address=", "--log.level=warn",
        ])
        state.urls.update({
            # With the real node on its address: the operator's Pod analyses rollouts on it.
            "PROMETHEUS_URL": f"http://{self.host_address}:{ports['prometheus']}",
            "ALERTMANAGER_URL": f"http://127.0.0.1:{ports['alertmanager']}",
            "KUBELOOP_WEBHOOK_PORT": str(ports["operator"]),
            "KUBELOOP_WEBHOOK_TOKEN_FILE": str(token),
            "KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE": str(signing),
            # The operator's work folder belongs to this platform, never to a folder all share.
            "KUBELOOP_WORK_DIR": str(self.dir / "operator"),
            "KUBELOOP_PROMETHEUS_TARGETS": str(targets),
            "KUBELOOP_MLFLOW_WEBHOOK_URL": f"http://{operator}/hooks/mlflow",
        })

    def _start_featurestore(self, state: PlatformState) -> None:
        """A Feast repository with 45 days of generated card-transaction data
        up to today, so that its online values are fresh (`kubeloop features
        add-period` replaces its last days with a drifted world's)."""
        repo = self.dir / "featurestore"
        redis = self.start_redis(state) if self.online_store is OnlineStoreKind.redis else ""
        self._spawn(state, "featurestore", [
            sys.executable, "-m", "kubeloop.featurestore.cli", "init", "--repo", str(repo),
            "--days", "45", *(["--redis", redis] if redis else []),
        ])
        state.urls["KUBELOOP_FEAST_REPO"] = str(repo)

    def start_redis(self, state: PlatformState | None = None) -> str:
        """Redis for Feast online stores, started once (on loopback, or with
        the real node on its address, as MLflow); its host:port."""
        state = state or self.state()
        if state is None:
            raise PlatformError(f"no platform in {self.dir}: `kubeloop dev up` first")
        bind = NODE_IP if state.real_node else "127.0.0.1"
        if not any(p.name == "redis" and p.running() for p in state.processes):
            state.ports["redis"] = processes.free_port()
            root = self.dir / "redis"
            root.mkdir(parents=True, exist_ok=True)
            self._spawn(state, "redis", onlinestore.build_redis_argv(
                onlinestore.redis_binary(), state.ports["redis"], root, bind))
            self._wait(state, "redis", lambda: onlinestore.answering(f"{bind}:{state.ports['redis']}"), 30)
        return f"{bind}:{state.ports['redis']}"

    def _start_objectstore(self, state: PlatformState) -> None:
        """SeaweedFS with an S3 gateway and a new access key; its buckets are
        created once it answers (in _install)."""
        root = self.s3_identities.parent
        (root / "data").mkdir(parents=True, exist_ok=True)
        objectstore.write_identities(self.s3_identities, objectstore.generate_credentials())
        self._spawn(state, "seaweedfs", objectstore.build_server_argv(
            objectstore.weed_binary(), root, state.ports, self.s3_identities, self.host_address))
        state.urls["KUBELOOP_REQUEST_LOG"] = f"s3://{objectstore.REQUEST_LOG_BUCKET}"

    def _start_mlflow(self, state: PlatformState) -> None:
        """MLflow's tracking server and model registry on sqlite, with its
        artifacts in the object store's bucket, which it serves itself
        (clients need the tracking URI only, never S3 credentials)."""
        root = self.dir / "mlflow"
        root.mkdir(parents=True, exist_ok=True)
        port = state.ports["mlflow"]
        self._spawn(state, "mlflow", [
            sys.executable, "-m", "mlflow", "server", "--host", self.host_address, "--port", str(port),
            *(["--allowed-hosts", f"{NODE_IP}:{port},{NODE_IP}"] if self.real_node else []),
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination", f"s3://{objectstore.ARTIFACT_BUCKET}/artifacts", "--serve-artifacts",
            "--workers", "1",
        ], env={
            **objectstore.env(_s3_endpoint(state), objectstore.read_credentials(self.s3_identities)),
            # Job workers cost ~2.4 GB and nothing here uses them.
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
            # Registry webhooks may reach the operator on loopback over http
            # (local development only), and new webhooks take effect at once.
            "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
            "MLFLOW_WEBHOOK_CACHE_TTL": "1",
            "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": _fernet_key(root / "webhook.key"),
        })
        state.urls["MLFLOW_TRACKING_URI"] = f"http://{self.host_address}:{port}"

    # -- helpers -----------------------------------------------------------

    def _wait_job(self, state: PlatformState, name: str, timeout: float) -> None:
        """Wait for a one-off process to finish; fail with its log if it failed."""
        record = next(p for p in state.processes if p.name == name)
        code = processes.wait_exit(record, timeout)
        if code is None:
            raise PlatformError(f"{name} did not finish in {timeout:.0f} s:\n{processes.log_tail(record.log)}")
        state.processes.remove(record)
        if code != 0:
            raise PlatformError(f"{name} failed (exit {code}):\n{processes.log_tail(record.log)}")

    def _spawn(self, state: PlatformState, name: str, argv: list[str], cwd: Path | None = None,
               env: dict[str, str] | None = None) -> None:
        state.processes.append(processes.start(name, argv, self.logs, env=env, cwd=cwd))
        self._save(state)

    def _save(self, state: PlatformState) -> None:
        if self.dir.exists():
            self.state_file.write_text(state.to_json())

    def _wait(self, state: PlatformState, component: str, ready: Callable[[], bool],
              timeout: float) -> None:
        """Poll until ready(); fail at once if the component exits, and with
        its log tail either way."""
        record = next(p for p in state.processes if p.name == component)

        def probe() -> bool:
            if not record.running():
                raise PlatformError(f"{component} exited:\n{processes.log_tail(record.log)}")
            try:
                return ready()
            except (KubeError, OSError):
                return False

        wait_for(probe, timeout, what=f"{component} ready", interval=0.1,
                 error=lambda message: PlatformError(f"{message}:\n{processes.log_tail(record.log)}"))


def prometheus_rbac() -> list[dict]:
    """Prometheus's identity (kubeloop.dev.podtargets) may list Pods, nothing else."""
    user = IDENTITIES["prometheus"][0]
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "kubeloop:prometheus"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "kubeloop:prometheus"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kubeloop:prometheus"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
    ]


def build_prometheus_config(rules: Path, targets: Path, alertmanager_port: int) -> dict:
    """Prometheus scrapes what registers itself under targets: the operator,
    local routers and, with the real node, its Pods that ask to be scraped
    (kubeloop.dev.podtargets)."""
    return {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [str(rules / "*.yaml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
        "scrape_configs": [{"job_name": "kubeloop", "file_sd_configs": [{"files": [str(targets / "*.json")],
                                                                          "refresh_interval": "5s"}]}],
    }


def build_alertmanager_config(webhook_url: str, token_file: Path) -> dict:
    """Retrain alerts go to the operator at once and are re-sent hourly while
    they fire (the operator's handling is idempotent); the rest go nowhere."""
    return {
        "route": {
            "receiver": "discard", "group_by": ["alertname", "namespace", "inferenceservice"],
            "group_wait": "1s", "group_interval": "10s", "repeat_interval": "1h",
            "routes": [{"receiver": "kubeloop-operator", "matchers": ['kubeloop_action="retrain"']}],
        },
        "receivers": [
            {"name": "discard"},
            {"name": "kubeloop-operator", "webhook_configs": [{
                "url": webhook_url, "send_resolved": False,
                "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
            }]},
        ],
    }


def _fernet_key(path: Path) -> str:
    """A key MLflow encrypts webhook secrets with, kept in the state dir."""
    if not path.exists():
        path.write_text(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode())
        path.chmod(0o600)
    return path.read_text()


def write_kubeconfig(path: Path, server: str, pki: Pki, identity: str) -> None:
    """One identity's kubeconfig, readable by its owner only."""
    path.write_text(yaml.safe_dump(build_kubeconfig(server, pki.ca_cert, pki.token(identity), identity)))
    path.chmod(0o600)


def build_kubeconfig(server: str, ca_file: Path, token: str, user: str) -> dict:
    """A kubeconfig that verifies the server against our CA and sends a token."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubeloop", "cluster": {"server": server,
                                                      "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "kubeloop", "context": {"cluster": "kubeloop", "user": user,
                                                      "namespace": "default"}}],
        "current-context": "kubeloop",
    }


def _s3_endpoint(state: PlatformState) -> str:
    return f"http://{NODE_IP if state.real_node else '127.0.0.1'}:{state.ports['seaweedfs-s3']}"


def _stop(record: processes.ProcessRecord) -> None:
    grace = objectstore.STOP_GRACE_SECONDS if record.name == "seaweedfs" else processes.STOP_TIMEOUT
    processes.stop(record, grace)


def _node_ready(found: dict) -> dict:
    conditions = {c["type"]: c for c in found.get("status", {}).get("conditions", [])}
    ready = conditions.get("Ready", {})
    return {"ready": ready.get("status") == "True", "message": ready.get("message", "not registered")}


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
