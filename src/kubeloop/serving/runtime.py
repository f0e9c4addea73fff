"""The local Triton runtime: the real `tritonserver` from the nvidia-pytriton
wheel, in its own environment (.venv-serving, see requirements/serving.txt).

The wheel ships the server, the python backend and a backend stub per
Python version. A plain tritonserver needs them laid out as a backend
directory, pyenv's libpython and the wheel's bundled libraries on
LD_LIBRARY_PATH, and (since the stub's embedded interpreter ignores
PYTHONPATH) the environment's site-packages named for model.py to add.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from kubeloop.paths import cache_dir, repo_root


class RuntimeMissing(RuntimeError):
    """The serving environment is not installed; the message says how to install it."""


@dataclass(frozen=True)
class TritonRuntime:
    site_packages: Path

    @classmethod
    def discover(cls) -> "TritonRuntime":
        venv = Path(os.environ.get("KUBELOOP_SERVING_VENV", repo_root() / ".venv-serving"))
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        runtime = cls(venv / "lib" / version / "site-packages")
        if not runtime.tritonserver.exists():
            raise RuntimeMissing(f"no tritonserver in {venv}: run `make serving-env` (requirements/serving.txt)")
        return runtime

    @property
    def root(self) -> Path:
        return self.site_packages / "pytriton" / "tritonserver"

    @property
    def tritonserver(self) -> Path:
        return self.root / "bin" / "tritonserver"

    def backend_dir(self) -> Path:
        """A backend directory with the python backend and this Python's stub
        (made once, next to the other cached binaries)."""
        minor = f"{sys.version_info.major}.{sys.version_info.minor}"
        target = cache_dir() / "triton-backends" / f"python{minor}"
        python = target / "python"
        if not (python / "triton_python_backend_stub").exists():
            python.mkdir(parents=True, exist_ok=True)
            for item in (self.root / "backends" / "python").iterdir():
                if item.is_file():
                    shutil.copy2(item, python / item.name)
            shutil.copy2(self.root / "python_backend_stubs" / minor / "triton_python_backend_stub",
                         python / "triton_python_backend_stub")
        return target

    def env(self) -> dict[str, str]:
        libs = [sysconfig.get_config_var("LIBDIR"), str(self.site_packages / "nvidia_pytriton.libs")]
        if os.environ.get("LD_LIBRARY_PATH"):
            libs.append(os.environ["LD_LIBRARY_PATH"])
        # The stub's embedded interpreter takes its prefix from the first
        # python on PATH: it must be the serving environment's, or an active
        # virtualenv's numpy is imported before model.py can say otherwise.
        path = [str(self.site_packages.parents[2] / "bin"), os.environ.get("PATH", "/usr/bin:/bin")]
        return {"LD_LIBRARY_PATH": ":".join(libs), "KUBELOOP_SITE_PACKAGES": str(self.site_packages),
                "PATH": ":".join(path), "VIRTUAL_ENV": str(self.site_packages.parents[2])}

    def argv(self, repository: Path, http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
        return [
            str(self.tritonserver), f"--model-repository={repository}", f"--backend-directory={self.backend_dir()}",
            "--model-control-mode=explicit", "--exit-on-error=false", "--strict-readiness=true",
            "--http-address=127.0.0.1", f"--http-port={http_port}",
            "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
            "--metrics-address=127.0.0.1", f"--metrics-port={metrics_port}",
            "--allow-metrics=true", "--log-verbose=0",
        ]
