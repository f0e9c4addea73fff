"""numpy's BLAS in the benchmark processes (and only there).

numpy's wheel carries OpenBLAS built for many CPUs and picks a kernel and its
blocking (from the L2 size) by asking the CPU. On a virtual CPU that answers
vaguely the choice can differ between machines of one type, and every
numpy-heavy figure with it. The benchmark therefore names the kernel and the
L2 size from what the CPU advertises, before numpy loads, unless the
environment already says, and prints the kernel in use.
"""

from __future__ import annotations

import os
from pathlib import Path

KERNELS = (("avx512f", "SkylakeX"), ("avx2", "Haswell"), ("avx", "Sandybridge"))
"""CPU flag -> OpenBLAS core type, most capable first."""


def choose(cpuinfo: str, l2_size: str) -> dict[str, str]:
    """OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (bytes) for this CPU (pure)."""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    out = {}
    kernel = next((name for flag, name in KERNELS if flag in flags), None)
    if kernel:
        out["OPENBLAS_CORETYPE"] = kernel
    size = l2_size.strip().upper()
    if size:
        scale = {"K": 1024, "M": 1024**2}.get(size[-1], 1)
        out["OPENBLAS_L2_SIZE"] = str(int(size.rstrip("KM")) * scale)
    return out


def configure() -> dict[str, str]:
    """Set what the environment does not already set; call before numpy loads."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cache = Path("/sys/devices/system/cpu/cpu0/cache/index2/size")
    wanted = choose(cpuinfo, cache.read_text() if cache.exists() else "")
    chosen = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(chosen)
    return chosen


def describe(chosen: dict[str, str]) -> str:
    """The BLAS numpy loaded, its kernel and threads, and what was set here."""
    import numpy  # noqa: F401 - loads the BLAS threadpoolctl reports
    from threadpoolctl import threadpool_info

    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    used = "; ".join(f"{i['internal_api']} {i.get('version')} kernel {i.get('architecture', '?')}, "
                     f"{i['num_threads']} thread(s)" for i in libs) or "no BLAS reported"
    env = ", ".join(f"{k}={os.environ[k]}" for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ)
    return f"numpy BLAS: {used} ({env or 'nothing pinned'}; set by the benchmark: {', '.join(chosen) or 'none'})"
