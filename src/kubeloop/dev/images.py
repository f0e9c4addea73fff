"""kubeloop's container images, built without Docker or a registry.

Each image is an OCI layout assembled with umoci and kept as a tar under
the cache directory, named by the project's version and a hash of its inputs,
so an unchanged image is never rebuilt; the real node imports the tars into
its containerd. The sandbox (pause) image is a tiny static Go program of our
own (tools/pause).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Callable

from kubeloop.dev.binaries import cache_dir, repo_root

PREFIX = "localhost/kubeloop"
PAUSE_SOURCE = ("tools/pause/go.mod", "tools/pause/main.go")


class ImageError(RuntimeError):
    """An image could not be built; the message says which step failed."""


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config the images set."""

    entrypoint: list[str]
    cmd: list[str] = field(default_factory=list)
    user: str = "65532:65532"
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"


@dataclass(frozen=True)
class Image:
    """A built image: its archive in the cache and the reference Pods use."""

    name: str
    tag: str
    archive: Path

    @property
    def ref(self) -> str:
        return f"{PREFIX}/{self.name}:{self.tag}"


def images_dir() -> Path:
    return cache_dir() / "images"


def image_tag(inputs: list[bytes]) -> str:
    """The project's version and a hash of everything the image is built from."""
    digest = hashlib.sha256()
    for item in inputs:
        digest.update(hashlib.sha256(item).digest())
    return f"{version('kubeloop')}-{digest.hexdigest()[:12]}"


def umoci_args(config: ImageConfig) -> list[str]:
    """`umoci config` flags that set config (its lists flag by flag)."""
    args = [f"--config.entrypoint={arg}" for arg in config.entrypoint]
    args += [f"--config.cmd={arg}" for arg in config.cmd]
    args += [f"--config.env={key}={value}" for key, value in config.env.items()]
    return args + [f"--config.user={config.user}", f"--config.workingdir={config.workdir}"]


def pause_image() -> Image:
    """The real node's sandbox image, built once per source change."""
    root = repo_root()
    tag = image_tag([(root / path).read_bytes() for path in PAUSE_SOURCE])
    image = Image("pause", tag, images_dir() / f"pause-{tag}.tar")
    if image.archive.exists():
        return image

    def populate(rootfs: Path) -> None:
        _run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(rootfs / "pause"), "."],
             cwd=root / "tools" / "pause", env_extra={"CGO_ENABLED": "0", "GOTOOLCHAIN": "local"})

    build_image(image, populate, ImageConfig(entrypoint=["/pause"], user="65535:65535"))
    return image


def build_image(image: Image, populate: Callable[[Path], None], config: ImageConfig) -> None:
    """Assemble image.archive: an empty OCI image, unpacked, filled by
    populate(rootfs), repacked as one layer, configured and tarred."""
    if shutil.which("umoci") is None:
        raise ImageError("umoci is not installed; run `make setup` (it installs Debian's umoci)")
    images_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=images_dir(), prefix=f".{image.name}-") as tmp:
        layout, bundle = Path(tmp) / "layout", Path(tmp) / "bundle"
        ref = f"{layout}:{image.tag}"
        _run(["umoci", "init", "--layout", str(layout)])
        _run(["umoci", "new", "--image", ref])
        _run(["umoci", "unpack", "--image", ref, str(bundle)])
        populate(bundle / "rootfs")
        _run(["umoci", "repack", "--image", ref, str(bundle)])
        _run(["umoci", "config", "--image", ref, *umoci_args(config)])
        _run(["umoci", "gc", "--layout", str(layout)])
        partial = image.archive.with_suffix(".partial")
        with tarfile.open(partial, "w") as archive:
            for entry in sorted(layout.iterdir()):
                archive.add(entry, arcname=entry.name)
        partial.rename(image.archive)


def _run(argv: list[str], cwd: Path | None = None, env_extra: dict[str, str] | None = None) -> None:
    env = {**os.environ, **(env_extra or {})}
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageError(f"{' '.join(argv[:3])} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
