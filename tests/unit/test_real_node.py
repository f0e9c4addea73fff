"""The real node's generated configs and image helpers, as plain data (no
process runs here; tests/e2e/test_real_node.py proves the node itself)."""

from __future__ import annotations

import ipaddress
import subprocess
import tomllib
from pathlib import Path

import pytest

from kubeloop.dev import dns, host
from kubeloop.dev.binaries import GROUPS, versions
from kubeloop.paths import repo_root
from kubeloop.dev.images import PYTHON_IMAGES, ImageConfig, image_tag, umoci_args
from kubeloop.dev.node import (
    CRI_VERSION, NodeError, NodePaths, bound_image_root, cri_ready, build_cni_config, build_containerd_config, build_kube_proxy_config,
    build_kubelet_config, import_image, import_timeout, kubelet_argv, socket_path_problem,
)
from kubeloop.dev.pki import NODE_IP, NODE_NAME, Pki
from kubeloop.dev.platform import KWOK_CIDR, Platform, PlatformError

PATHS = NodePaths(Path("/state/node"), Path("/run/kubeloop/0123456789ab"))
CRI = "io.containerd.grpc.v1.cri"


def test_containerd_keeps_everything_under_the_state_dir_and_restricts_oom_score_adj():
    config = tomllib.loads(build_containerd_config(PATHS, "localhost/kubeloop/pause:1"))
    cri = config["plugins"][CRI]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == "localhost/kubeloop/pause:1"
    assert cri["stream_server_address"] == "127.0.0.1"
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is False
    paths = [config["root"], config["state"], runc["Root"], cri["cni"]["conf_dir"],
             config["plugins"]["io.containerd.internal.v1.opt"]["path"]]
    assert all(Path(p).is_relative_to(PATHS.root) for p in paths), paths
    sockets = [config["grpc"]["address"], config["ttrpc"]["address"]]
    # Unix socket paths are limited to 108 bytes; a state directory can be longer.
    assert all(Path(s).parent == PATHS.sockets and len(s) < 100 for s in sockets), sockets


def test_a_kept_image_root_holds_containerds_images_and_the_rest_stays_under_the_state_dir():
    kept = NodePaths(PATHS.root, PATHS.sockets, Path("/cache/containerd-1.6.20"))
    config = tomllib.loads(build_containerd_config(kept, "localhost/kubeloop/pause:1"))
    assert config["root"] == "/cache/containerd-1.6.20"
    runc = config["plugins"][CRI]["containerd"]["runtimes"]["runc"]["options"]
    assert all(Path(p).is_relative_to(PATHS.root) for p in (config["state"], runc["Root"])), config


def test_a_kept_image_root_past_its_bound_starts_again_empty_and_one_within_it_is_kept(tmp_path):
    root = tmp_path / "containerd-1.6.20"
    (root / "snapshots").mkdir(parents=True)
    (root / "snapshots" / "layer").write_bytes(b"x" * 4096)
    assert bound_image_root(root, limit=1 << 20) == 0 and (root / "snapshots" / "layer").exists()
    assert bound_image_root(root, limit=1024) >= 4096
    assert not root.exists()


def test_an_import_gets_time_by_its_archives_size_and_one_that_runs_past_it_names_the_archive(tmp_path, monkeypatch):
    assert import_timeout(700 * 2**20) == 300  # the runtime image and smaller: the floor
    # The training image (3.1 GiB) ran past 300 s into an empty root on two busy cores.
    assert import_timeout(int(3.1 * 2**30)) > 750
    archive = tmp_path / "training-0.1.0-abc.tar"
    archive.write_bytes(b"x" * 1024)
    asked = {}

    def slow(paths, *args, timeout):  # noqa: ANN001, ANN202 - ctr's signature
        asked["timeout"] = timeout
        raise subprocess.TimeoutExpired(["ctr", *args], timeout)

    monkeypatch.setattr("kubeloop.dev.node.ctr", slow)
    with pytest.raises(NodeError, match=r"training-0\.1\.0-abc\.tar took over 300 s"):
        import_image(PATHS, archive, "localhost/kubeloop/training:0.1.0-abc")
    assert asked["timeout"] == 300


def test_kubelet_accepts_cgroup_v1_and_binds_only_the_node_address_and_loopback():
    config = build_kubelet_config(PATHS, Pki(Path("/state/pki")))
    assert config["syncFrequency"] == "10s"  # routes in a ConfigMap volume reach router Pods soon
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert (config["address"], config["healthzBindAddress"], config["readOnlyPort"]) == (NODE_IP, "127.0.0.1", 0)
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["containerRuntimeEndpoint"] == f"unix://{PATHS.socket}"
    for key in ("resolvConf", "podLogsDir", "volumePluginDir"):
        assert Path(config[key]).is_relative_to(PATHS.root), key
    argv = kubelet_argv(Path("/bin/kubelet"), PATHS)
    assert f"--hostname-override={NODE_NAME}" in argv and f"--root-dir={PATHS.kubelet_root}" in argv


def test_cluster_dns_answers_only_for_the_cluster_on_the_node_address():
    """Backend: none (plain data). The kubelet points Pods at kube-dns's
    address, which the Service holds and the EndpointSlice sends to the node's
    address, the only one CoreDNS binds; no forward plugin, so no name leaves."""
    corefile = dns.build_corefile(Path("/state/node/coredns.kubeconfig"), 12345)
    assert {line.strip() for line in corefile.splitlines() if line.strip().startswith("bind")} == {f"bind {NODE_IP}"}
    assert "forward" not in corefile and "ready 127.0.0.1:12345" in corefile
    assert "kubeconfig /state/node/coredns.kubeconfig kubeloop" in corefile
    assert build_kubelet_config(PATHS, Pki(Path("/state/pki")))["clusterDNS"] == [dns.DNS_IP]
    objects = {o["kind"]: o for o in dns.build_objects()}
    service, endpoints = objects["Service"], objects["EndpointSlice"]
    assert service["spec"]["clusterIP"] == dns.DNS_IP and "selector" not in service["spec"]
    assert ipaddress.ip_address(dns.DNS_IP) in ipaddress.ip_network(host.SERVICE_CIDR)
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == service["metadata"]["name"]
    assert endpoints["endpoints"][0]["addresses"] == [NODE_IP]
    assert {(p["name"], p["protocol"]) for p in endpoints["ports"]} == \
        {(p["name"], p["protocol"]) for p in service["spec"]["ports"]}
    verbs = {verb for rule in objects["ClusterRole"]["rules"] for verb in rule["verbs"]}
    assert verbs == {"list", "watch"}
    assert objects["ClusterRoleBinding"]["subjects"][0]["name"] == dns.USER
    assert versions()[GROUPS["coredns"][1]]  # the build is pinned in tools/versions.env


def test_kube_proxy_uses_iptables_on_loopback_and_leaves_conntrack_sysctls_alone():
    config = build_kube_proxy_config(PATHS)
    assert config["mode"] == "iptables"
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["conntrack"]["tcpEstablishedTimeout"] == "0s"
    assert config["nodePortAddresses"] == ["127.0.0.0/8"]
    for key in ("healthzBindAddress", "metricsBindAddress"):
        assert config[key].startswith("127.0.0.1:"), key


def test_pod_network_is_a_bridge_without_masquerade_inside_the_blackholed_pod_range():
    plugin = build_cni_config(PATHS)["plugins"][0]
    assert plugin["type"] == "bridge" and plugin["bridge"] == host.BRIDGE
    assert plugin["ipMasq"] is False
    subnet = ipaddress.ip_network(plugin["ipam"]["ranges"][0][0]["subnet"])
    assert subnet.subnet_of(ipaddress.ip_network(host.POD_CIDR))
    assert not subnet.overlaps(ipaddress.ip_network(KWOK_CIDR))  # no real Pod shares a fake Pod's address
    assert ipaddress.ip_address(NODE_IP) in subnet
    assert Path(plugin["ipam"]["dataDir"]).is_relative_to(PATHS.root)


@pytest.mark.parametrize("rule, ours", [
    ("-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD", True),
    ("-A FORWARD -j KUBELOOP-FORWARD", True),
    ("-A POSTROUTING -s 10.244.128.0/24 -j CNI-abc", True),
    ("-A PREROUTING -g KUBE-SERVICES", True),
    ("-A FORWARD -i eth0 -j ACCEPT", False),
    ("-A OUTPUT -j DOCKER", False),
])
def test_teardown_deletes_only_jumps_into_the_nodes_chains(rule, ours):
    import shlex

    assert host._jumps_to_ours(shlex.split(rule)) is ours


def test_umoci_config_flags_carry_each_list_item():
    config = ImageConfig(entrypoint=["tini", "--"], cmd=["kubeloop", "operator"], user="65532:65532",
                         env={"PATH": "/opt/kubeloop/bin:/usr/bin"}, workdir="/tmp")
    assert umoci_args(config) == [
        "--config.entrypoint=tini", "--config.entrypoint=--", "--config.cmd=kubeloop", "--config.cmd=operator",
        "--config.env=PATH=/opt/kubeloop/bin:/usr/bin", "--config.user=65532:65532", "--config.workingdir=/tmp"]


def test_image_tags_change_with_any_input_and_only_then():
    tag = image_tag([b"a", b"b"])
    assert tag == image_tag([b"a", b"b"])
    assert tag != image_tag([b"a", b"c"]) and tag != image_tag([b"ab"])
    assert tag.split("-")[0].count(".") == 2  # the project's version comes first


@pytest.mark.parametrize("name", sorted(PYTHON_IMAGES))
def test_local_images_install_the_dockerfiles_package_list_as_a_numeric_non_root_user(name):
    """One package list per image, read by both builds: the Dockerfile's
    target of the same name installs the requirements file the local build
    does. Only the training image has torch."""
    spec = PYTHON_IMAGES[name]
    dockerfile = (repo_root() / "images" / "Dockerfile").read_text()
    assert f"AS build-{name}\n" in dockerfile and f"-r {spec.requirements}" in dockerfile
    lines = (repo_root() / spec.requirements).read_text().splitlines()
    packages = [line.split("==")[0].split("[")[0].strip() for line in lines if line.strip() and line[0] != "#"]
    assert packages and ("torch" in packages) == (name == "training")
    user = spec.config.user.split(":")[0]
    assert user.isdigit() and int(user) != 0


def test_an_image_of_kubeloop_in_the_cache_needs_nothing_of_its_requirements_image(tmp_path, monkeypatch):
    """Cluster images: kubeloop's layer is named by its requirements' image's
    tag and the code, so a cached one is used as it is (no build of the
    gigabytes under it, even where their archive is gone), and a change to
    the code names a new layer over the same requirements."""
    from kubeloop.dev import images

    monkeypatch.setenv("KUBELOOP_CACHE", str(tmp_path))
    spec = PYTHON_IMAGES["training"]
    planned = images.planned_image(spec)
    planned.archive.parent.mkdir(parents=True)
    planned.archive.write_bytes(b"cached")
    assert images.python_image(spec, ["false"]) == planned  # pip `false`: any build would fail
    requirements = images.planned_image(images._requirements(spec))
    assert not requirements.archive.exists()
    (tmp_path / "src" / "kubeloop").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "images/training.txt", "requirements/constraints.txt",
                 "images/triton-setup.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((repo_root() / name).read_bytes())
    monkeypatch.setattr(images, "repo_root", lambda: tmp_path)  # a checkout whose code is another
    assert images.planned_image(spec).tag != planned.tag
    assert images.planned_image(images._requirements(spec)) == requirements


def test_a_second_build_of_an_image_waits_for_the_first(tmp_path, monkeypatch):
    """Cluster images: `make test` builds the images in the background while a
    real-node test may ask for the same image; the second caller must wait for
    the first build (and then find it cached), not build it a second time."""
    import threading

    from kubeloop.dev import images

    monkeypatch.setenv("KUBELOOP_CACHE", str(tmp_path))
    order: list[str] = []
    first_inside = threading.Event()

    def first() -> None:
        with images._one_build("runtime"):
            first_inside.set()
            order.append("first in")
            threading.Event().wait(0.3)  # the build's work
            order.append("first out")

    def second() -> None:
        first_inside.wait(5)
        with images._one_build("runtime"):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == ["first in", "first out", "second in"]


def test_a_state_dir_too_long_for_the_kubelet_s_sockets_is_refused_before_anything_starts(tmp_path):
    """The kubelet binds sockets under its root: past a unix socket path's
    107 bytes it dies at start (seen under xdist's longer temporary
    folders), so `dev up` refuses such a state directory by name first."""
    fits = Path("/" + "s" * 66)  # + /node/kubelet/pod-resources/ + 12 = 107
    assert socket_path_problem(NodePaths(fits / "node", PATHS.sockets)) is None
    assert "--state-dir of at most 67 bytes" in socket_path_problem(NodePaths(Path(f"{fits}s") / "node",
                                                                               PATHS.sockets))
    long = tmp_path / ("d" * (110 - len(str(tmp_path))))
    with pytest.raises(PlatformError, match="--state-dir of at most 67 bytes"):
        Platform(long, real_node=True).up()
    assert not long.exists()


def test_containerd_is_ready_only_once_its_cri_plugin_answers_the_kubelets_first_call(tmp_path):
    """A CRI server (grpc, on a unix socket as containerd's) that answers as
    containerd 1.6 does while it recovers its root, then as when it serves."""
    import grpc
    from concurrent import futures

    initialized = False

    def version(request: bytes, context: grpc.ServicerContext) -> bytes:
        if not initialized:
            context.abort(grpc.StatusCode.UNKNOWN, "server is not initialized yet")
        return b""

    service, method = CRI_VERSION.strip("/").split("/")
    handler = grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(
        version, request_deserializer=bytes, response_serializer=bytes)})
    paths = NodePaths(tmp_path, tmp_path)
    assert not cri_ready(paths)  # no socket yet
    server = grpc.server(futures.ThreadPoolExecutor(1), handlers=[handler])
    server.add_insecure_port(f"unix://{paths.socket}")
    server.start()
    try:
        assert not cri_ready(paths)
        initialized = True
        assert cri_ready(paths)
    finally:
        server.stop(None)
