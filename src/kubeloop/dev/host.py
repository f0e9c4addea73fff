"""What the real node changes on this machine, and how each change is undone.

The real node needs a Pod bridge, blackhole routes for the Pod and Service
ranges, a forwarding guard, a few sysctls, and it leaves cgroups, mounts,
network namespaces and iptables chains behind when it dies. Every change is
named here so that `dev down`, and `dev up` after a crash, can find and
remove it. Only one real node runs per machine: the claim file under /run
says which state directory owns the host's changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kubeloop.dev.pki import NODE_IP

BRIDGE = "kubeloop0"
NODE_CIDR = "10.244.128.0/24"
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/12"
BLACKHOLES = (POD_CIDR, SERVICE_CIDR)
GUARD_CHAIN = "KUBELOOP-FORWARD"
# Chains made by kube-proxy and the kubelet (KUBE-), the CNI plugins (CNI-) and us.
CHAIN_PREFIXES = ("KUBE-", "CNI-", "KUBELOOP-")
TABLES = ("filter", "nat", "mangle", "raw")
IPTABLES = ("iptables", "ip6tables")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAME = "kubepods"
NETNS_DIR = Path("/run/netns")
CONTAINER_LOGS = Path("/var/log/containers")
RUN_DIR = Path("/run/kubeloop")
CLAIM = RUN_DIR / "real-node.json"
# Made outside the state directory by parts that hard-code the path: the CNI
# result cache (libcni), shim sockets (containerd), the device-plugin socket
# (kubelet). Only one real node runs per machine, so what matches here is its
# own. (/usr/libexec/kubernetes is not: every kube-controller-manager, the
# fake-only platforms' too, makes its flexvolume folder there.)
HOST_FILES = {
    Path("/var/lib/cni/results"): ("kubeloop-*", "cni-loopback-*"),
    Path("/var/lib/kubelet/device-plugins"): ("kubelet.sock", "DEPRECATION"),
    Path("/run/containerd/s"): ("*",),
}
# Removed when empty, children before parents.
HOST_DIRS = (
    Path("/var/lib/cni/results"), Path("/var/lib/cni"), Path("/var/lib/kubelet/device-plugins"),
    Path("/var/lib/kubelet"), Path("/run/containerd/s"), Path("/run/containerd"), RUN_DIR,
)
# Set by us (forwarding, bridge netfilter), kube-proxy (route_localnet) and
# the kubelet (its kernel defaults): each is put back as it was.
SYSCTLS = (
    "net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
)


class HostError(RuntimeError):
    """The host cannot take a real node now; the message says why and what to do."""


@dataclass
class Claim:
    """Which state directory's real node owns the host's changes, and the
    sysctl values from before it changed them."""

    state_dir: str
    sysctls: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls) -> "Claim | None":
        try:
            return cls(**json.loads(CLAIM.read_text()))
        except FileNotFoundError:
            return None

    def write(self) -> None:
        CLAIM.parent.mkdir(parents=True, exist_ok=True)
        CLAIM.write_text(json.dumps(asdict(self)))


def socket_dir(state_dir: Path) -> Path:
    """containerd's sockets: unix socket paths cannot be as long as a state
    directory's can, so they live in a short folder named after it."""
    return RUN_DIR / hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]


# -- what is there ---------------------------------------------------------

def leftovers(state_dir: Path | None = None) -> dict[str, list[str]]:
    """Everything a real node leaves on the host that is still there, by kind
    (empty lists when the host is clean)."""
    return {
        "processes": [f"{p.pid} {p.name()}" for p in node_processes(state_dir)],
        "mounts": [str(m) for m in mounts(state_dir)],
        "cgroups": [str(c) for c in cgroups()],
        "bridge": [BRIDGE] if _link_exists(BRIDGE) else [],
        "iptables chains": [f"{cmd} {table} {chain}" for cmd, table, chain in chains()],
        "routes": [f"blackhole {cidr}" for cidr in BLACKHOLES if _blackhole(cidr)],
        "network namespaces": [str(p) for p in _netns()],
        "files": [str(p) for p in host_files()],
    }


def host_files() -> list[Path]:
    """HOST_FILES that exist, and HOST_DIRS that are left empty."""
    found = [f for folder, patterns in HOST_FILES.items() for pattern in patterns for f in folder.glob(pattern)]
    return found + [d for d in HOST_DIRS if d.is_dir() and not any(d.iterdir())]


def _listening_on_node_address() -> set[int]:
    """Processes listening on the node's address: only a real node's parts
    bind it, and one whose claim is gone (its run was killed) would keep the
    next kubelet from its port, the address surviving the bridge's removal."""
    import psutil

    return {c.pid for c in psutil.net_connections("tcp") if c.pid and c.status == psutil.CONN_LISTEN
            and c.laddr and c.laddr.ip == NODE_IP}


def node_processes(state_dir: Path | None) -> list:
    """Processes of a real node: those in its cgroups, those listening on its
    address, and those whose command line names a path inside the state
    directory (containerd's shims)."""
    import psutil

    pids = {pid for cg in cgroups() for pid in _cgroup_pids(cg)} | _listening_on_node_address()
    if state_dir is not None:
        markers = (f"{state_dir}/", f"{socket_dir(state_dir)}/")
        for proc in psutil.process_iter(["cmdline"]):
            if any(marker in arg for arg in proc.info["cmdline"] or () for marker in markers):
                pids.add(proc.pid)
    pids.discard(os.getpid())
    found = []
    for pid in sorted(pids):
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return found


def mounts(state_dir: Path | None) -> list[Path]:
    """Mount points under the state directory and the CNI network namespaces,
    deepest first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].encode().decode("unicode_escape"))
        inside = state_dir is not None and (point == state_dir or state_dir in point.parents)
        if inside or (point.parent == NETNS_DIR and point.name.startswith("cni-")):
            points.append(point)
    return sorted(set(points), key=lambda p: len(p.parts), reverse=True)


def cgroups() -> list[Path]:
    """The kubepods cgroup of each hierarchy, with every cgroup below it, deepest first."""
    found = []
    for hierarchy in CGROUP_ROOT.iterdir() if CGROUP_ROOT.exists() else ():
        top = hierarchy / CGROUP_NAME
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def chains() -> list[tuple[str, str, str]]:
    """(command, table, chain) of every chain a real node made."""
    found = []
    for command in IPTABLES:
        for table in TABLES:
            for line in _iptables_rules(command, table):
                if line.startswith("-N ") and line.split()[1].startswith(CHAIN_PREFIXES):
                    found.append((command, table, line.split()[1]))
    return found


# -- changing the host -----------------------------------------------------

def prepare(state_dir: Path) -> Claim:
    """Claim the host for this state directory's real node and make the
    network changes it needs before containerd and the kubelet start."""
    claim = Claim(str(state_dir), {key: _sysctl(key) for key in SYSCTLS if _sysctl(key) is not None})
    claim.write()
    for key, value in (("net/ipv4/ip_forward", "1"), ("net/bridge/bridge-nf-call-iptables", "1")):
        _set_sysctl(key, value)
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{NODE_IP}/{NODE_CIDR.split('/')[1]}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for cidr in BLACKHOLES:
        _ip("route", "replace", "blackhole", cidr)
    # Pod traffic stays on the bridge: nothing is forwarded between the Pods
    # and any other interface (mangle runs before kube-proxy's filter rules).
    _iptables("iptables", "mangle", "-N", GUARD_CHAIN)
    _iptables("iptables", "mangle", "-A", GUARD_CHAIN, "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP")
    _iptables("iptables", "mangle", "-A", GUARD_CHAIN, "-o", BRIDGE, "!", "-i", BRIDGE, "-j", "DROP")
    _iptables("iptables", "mangle", "-I", "FORWARD", "1", "-j", GUARD_CHAIN)
    return claim


def clean(state_dir: Path | None, claim: Claim | None = None) -> None:
    """Undo everything a real node changed, whether it stopped cleanly or not:
    kill its processes, unmount, remove cgroups, the bridge, routes, chains,
    namespaces and container log links, put the sysctls back, drop the claim."""
    _kill(node_processes(state_dir))
    for point in mounts(state_dir):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
        if point.parent == NETNS_DIR:
            point.unlink(missing_ok=True)
    _remove_cgroups()
    if _link_exists(BRIDGE):
        _ip("link", "del", BRIDGE)
    for cidr in BLACKHOLES:
        if _blackhole(cidr):
            _ip("route", "del", "blackhole", cidr)
    _remove_chains()
    _remove_container_logs(state_dir)
    if state_dir is not None:
        shutil.rmtree(socket_dir(state_dir), ignore_errors=True)
    for folder, patterns in HOST_FILES.items():
        for pattern in patterns:
            for found in folder.glob(pattern):
                found.unlink(missing_ok=True)
    for key, value in (claim.sysctls if claim else {}).items():
        _set_sysctl(key, value)
    CLAIM.unlink(missing_ok=True)
    for folder in HOST_DIRS:
        if folder.is_dir() and not any(folder.iterdir()):
            try:
                folder.rmdir()
            except OSError:  # refilled meanwhile: no longer ours to remove
                pass


def _kill(procs: list) -> None:
    import psutil

    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def _remove_cgroups() -> None:
    """Kill what is left in the kubepods cgroups, then remove them deepest first."""
    deadline = time.monotonic() + 10
    for cg in cgroups():
        while True:
            pids = _cgroup_pids(cg)
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        try:
            cg.rmdir()
        except FileNotFoundError:
            pass
        except OSError:  # still busy: one more try after the others
            time.sleep(0.1)
            cg.rmdir()


def _remove_chains() -> None:
    """Delete the built-in chains' jumps into our chains, then flush and delete them."""
    for command in IPTABLES:
        for table in TABLES:
            rules = _iptables_rules(command, table)
            ours = [line.split()[1] for line in rules
                    if line.startswith("-N ") and line.split()[1].startswith(CHAIN_PREFIXES)]
            for line in rules:
                args = shlex.split(line)
                if args[0] == "-A" and not args[1].startswith(CHAIN_PREFIXES) and _jumps_to_ours(args):
                    _iptables(command, table, "-D", *args[1:])
            for chain in ours:
                _iptables(command, table, "-F", chain)
            for chain in ours:
                _iptables(command, table, "-X", chain)


def _jumps_to_ours(args: list[str]) -> bool:
    for flag in ("-j", "-g"):
        if flag in args and args[args.index(flag) + 1].startswith(CHAIN_PREFIXES):
            return True
    return False


def _remove_container_logs(state_dir: Path | None) -> None:
    """The kubelet links each container's log into /var/log/containers."""
    if not CONTAINER_LOGS.is_dir():
        return
    for link in CONTAINER_LOGS.iterdir():
        if link.is_symlink() and (not link.exists() or (state_dir is not None and f"{state_dir}/" in os.readlink(link))):
            link.unlink()
    if not any(CONTAINER_LOGS.iterdir()):
        CONTAINER_LOGS.rmdir()


# -- small wrappers ----------------------------------------------------------

def _cgroup_pids(cg: Path) -> list[int]:
    try:
        return [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _netns() -> list[Path]:
    return sorted(NETNS_DIR.glob("cni-*")) if NETNS_DIR.exists() else []


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _blackhole(cidr: str) -> bool:
    out = subprocess.run(["ip", "route", "show", "type", "blackhole", cidr], capture_output=True, text=True)
    return bool(out.stdout.strip())


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise HostError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def _iptables(command: str, table: str, *args: str) -> None:
    result = subprocess.run([command, "-w", "5", "-t", table, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise HostError(f"{command} -t {table} {' '.join(args)} failed: {result.stderr.strip()}")


def _iptables_rules(command: str, table: str) -> list[str]:
    if shutil.which(command) is None:
        return []
    result = subprocess.run([command, "-w", "5", "-t", table, "-S"], capture_output=True, text=True)
    return result.stdout.splitlines() if result.returncode == 0 else []


def _sysctl(key: str) -> str | None:
    try:
        return Path("/proc/sys", key).read_text().strip()
    except OSError:
        return None


def _set_sysctl(key: str, value: str) -> None:
    try:
        Path("/proc/sys", key).write_text(value)
    except OSError as exc:
        raise HostError(f"cannot set {key.replace('/', '.')} to {value}: {exc}") from exc
