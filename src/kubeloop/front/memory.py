"""What a server uses of the machine's memory, as a pool (kubeloop.front.pool) budgets it."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Iterable

import psutil

STUB = "triton_python_backend_stub"


def private_by_process(pid: int) -> dict[int, float]:
    """Process id -> the memory no other process shares (MiB, unique set
    size), for a process (first) and its descendants: what stopping them
    frees. Not the proportional share of shared pages (PSS): a pool's
    members map the same libraries, so one member's PSS rises as another's
    processes exit, and a budget on it is broken by what the other member
    does. Empty once the process has gone."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for proc in family:
        try:
            found[proc.pid] = proc.memory_full_info().uss / 2**20
        except psutil.Error:  # exited meanwhile
            continue
    return found


def server_on_port(port: int) -> int | None:
    """The Triton server started with --http-port=port on this machine (a
    pool Pod's containers share their process namespace), the outermost
    where a launcher passed its arguments on; None while none runs."""
    flag = f"--http-port={port}"
    found = {}
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        if flag in (proc.info["cmdline"] or ()):
            found[proc.pid] = proc.info["ppid"]
    return next((pid for pid, parent in sorted(found.items()) if parent not in found), None)


def python_stubs(pids: Iterable[int]) -> dict[int, str]:
    """Process id -> the model served, for the python backend's stubs among
    the processes (a stub's first argument is its model's
    <repository>/<model>/<version>/model.py); processes that are not stubs,
    or have exited, are left out."""
    found = {}
    for pid in pids:
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if len(argv) > 1 and argv[0].endswith(STUB):
            found[pid] = PurePosixPath(argv[1]).parts[-3]
    return found


def private_mib(pid: int) -> float:
    """private_by_process's total."""
    return sum(private_by_process(pid).values())


def growth(before: dict[int, float], after: dict[int, float]) -> float:
    """What a server grew by between two readings of private_by_process:
    its own process's growth and the processes it started meanwhile (a
    model's backend processes), not what its other processes did then (a
    model serving requests grows and shrinks as it runs them) (pure)."""
    root = next(iter(after), None)
    own = after.get(root, 0.0) - before.get(root, 0.0) if root in before else 0.0
    return max(own, 0.0) + sum(mib for pid, mib in after.items() if pid not in before)
