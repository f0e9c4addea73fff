"""Where the Go-built platform binaries are cached, keyed by version."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Callable

from kubeloop.paths import cache_dir, repo_root

# binary -> (its group's folder under bin/, the version that keys the group)
GROUPS = {
    **{name: ("kubernetes", "KUBERNETES_VERSION") for name in
       ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")},
    "kubelet": ("node", "KUBERNETES_VERSION"),
    "kube-proxy": ("node", "KUBERNETES_VERSION"),
    "coredns": ("coredns", "COREDNS_VERSION"),
    "kwok": ("kwok", "KWOK_VERSION"),
    "helm": ("helm", "HELM_VERSION"),
    "manager": ("kserve", "KSERVE_VERSION"),  # KServe's controller manager
    # Kubeflow Trainer's controller manager and JobSet's, one build
    "trainer-controller-manager": ("trainer", "TRAINER_VERSION"),
    "jobset": ("trainer", "TRAINER_VERSION"),
    "adapter": ("prometheus-adapter", "PROMETHEUS_ADAPTER_VERSION"),  # the custom metrics API
}


class MissingBinary(RuntimeError):
    """A platform binary has not been built on this machine yet."""


@lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    text = (repo_root() / "tools" / "versions.env").read_text()
    return dict(re.findall(r"^([A-Z_]+)=(\S+)$", text, flags=re.M))


def binary(name: str) -> Path:
    """The cached binary, or MissingBinary saying how to build it."""
    group, key = GROUPS[name]
    version = versions()[key]
    path = cache_dir() / "bin" / f"{group}-{version}" / name
    if not path.exists():
        raise MissingBinary(
            f"{name} {version} is not built on this machine ({path} is missing); "
            "run `make setup` (it runs tools/build-binaries.sh once per version)"
        )
    return path


def ensure(name: str, progress: Callable[[str], None] = lambda _: None) -> Path:
    """The cached binary, built first if it is missing (once per version; a
    build already running, such as make test's in the background, is waited
    for rather than repeated)."""
    try:
        return binary(name)
    except MissingBinary:
        pass
    group = GROUPS[name][0]
    progress(f"building {name} {versions()[GROUPS[name][1]]} (once per version; a cold build takes minutes)")
    script = repo_root() / "tools" / "build-binaries.sh"
    result = subprocess.run([str(script), group], capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise MissingBinary(f"building {name} failed ({script} {group}, exit {result.returncode}):\n{tail}")
    return binary(name)
