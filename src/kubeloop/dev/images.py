"""kubeloop's container images, built without Docker or a registry.

Each image is an OCI layout assembled with umoci and kept as a tar under
the cache directory, named by the project's version and a hash of its inputs,
so an unchanged image is never rebuilt; the real node imports the tars into
its containerd. The sandbox (pause) image is a tiny static Go program of our
own (tools/pause).
"""

from __future__ import annotations

import compileall
import fcntl
import hashlib
import inspect
import os
import py_compile
import shutil
import subprocess
import tarfile
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Callable, Iterator

from kubeloop.paths import cache_dir, repo_root

PREFIX = "localhost/kubeloop"
PAUSE_SOURCE = ("tools/pause/go.mod", "tools/pause/main.go")
# The Debian root every Python image starts from: python3 (with venv for the
# project's environments) and tini, so PID 1 forwards SIGTERM.
BASE_PACKAGES = ("python3", "python3-venv", "tini", "ca-certificates")
APT_SOURCES = Path("/etc/apt")
USER_ID = "65532"


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


def debian_suite() -> str:
    text = Path("/etc/os-release").read_text()
    return next(line.split("=", 1)[1].strip('"') for line in text.splitlines()
                if line.startswith("VERSION_CODENAME="))


def apt_source_files() -> list[Path]:
    """This machine's active apt sources: mmdebstrap reads the same mirrors
    apt-get does (nothing names a mirror of its own)."""
    files = [APT_SOURCES / "sources.list"] + sorted((APT_SOURCES / "sources.list.d").glob("*"))
    return [f for f in files if f.suffix in (".list", ".sources") and f.is_file() and f.stat().st_size]


def rootfs_archive(extra: tuple[str, ...] = ()) -> Path:
    """Where base_rootfs(extra) is kept, named by suite, package set and apt sources."""
    suite = debian_suite()
    key = image_tag([suite.encode(), " ".join(BASE_PACKAGES + extra).encode(),
                     *(f.read_bytes() for f in apt_source_files())])
    return images_dir() / f"rootfs-{suite}-{key}.tar"


def base_rootfs(extra: tuple[str, ...] = ()) -> Path:
    """A minbase Debian root (BASE_PACKAGES and extra) as a tar, built once
    per suite, package set and apt sources."""
    tar = rootfs_archive(extra)
    if tar.exists():
        return tar
    sources, suite, packages = apt_source_files(), debian_suite(), BASE_PACKAGES + extra
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is not installed; run `make setup` (it installs Debian's mmdebstrap)")
    images_dir().mkdir(parents=True, exist_ok=True)
    partial = tar.with_suffix(".partial.tar")
    _run(["mmdebstrap", "--variant=minbase", "--quiet", f"--include={','.join(packages)}",
          "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
          suite, str(partial), *map(str, sources)])
    partial.rename(tar)
    return tar


def extract(tar: Path, rootfs: Path) -> None:
    """Unpack the Debian root and add the images' user: Pods run as 65532,
    and Python's getpass (kopf asks it for an identity) needs a passwd entry."""
    _run(["tar", "-xf", str(tar), "-C", str(rootfs), "--numeric-owner", "--same-permissions"])
    _run(["chroot", str(rootfs), "groupadd", "--gid", USER_ID, "kubeloop"])
    _run(["chroot", str(rootfs), "useradd", "--uid", USER_ID, "--gid", USER_ID, "--home-dir", "/tmp",
          "--no-create-home", "--shell", "/usr/sbin/nologin", "kubeloop"])


def base_image() -> Image:
    """Debian with python3 and tini, running as nobody-like 65532: enough for
    plain processes in tests (an HTTP server, a memory hog)."""
    rootfs_tar = base_rootfs()
    tag = image_tag([rootfs_tar.name.encode(), Path(__file__).read_bytes()])
    image = Image("base", tag, images_dir() / f"base-{tag}.tar")
    if not image.archive.exists():
        build_image(image, lambda rootfs: extract(rootfs_tar, rootfs),
                    ImageConfig(entrypoint=["/usr/bin/tini", "--"], cmd=["python3"], workdir="/tmp",
                                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp"}))
    return image


@dataclass(frozen=True)
class PythonImage:
    """An image of BASE_PACKAGES plus a venv at /opt/<name> installed from a
    requirements file (the same file images/Dockerfile installs)."""

    name: str
    requirements: str
    config: ImageConfig
    project: bool = True
    """Install kubeloop itself (with --no-deps: the requirements file decides),
    in a layer of its own over an image of the requirements (`<name>-deps`),
    so a change to the code rebuilds only that layer."""
    constraints: str | None = "requirements/constraints.txt"
    debs: tuple[str, ...] = ()
    """Debian packages beyond BASE_PACKAGES."""
    finish: Callable[[Path], None] | None = None
    """Last touches to the root, after the venv is installed."""


VENV = "/opt/kubeloop"
IMAGE_PYTHON = "python3.11"
"""Debian bookworm's python3, the Python of every image's venv."""
_PYTHON_ENV = {"PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "PYTHONUNBUFFERED": "1",
               "PYTHONDONTWRITEBYTECODE": "1"}
TRITON_SETUP = "images/triton-setup.sh"


def _lay_out_triton(rootfs: Path) -> None:
    """The same layout step images/Dockerfile runs (one script for both)."""
    shutil.copy(repo_root() / TRITON_SETUP, rootfs / "tmp" / "triton-setup.sh")
    _run(["chroot", str(rootfs), "/bin/sh", "/tmp/triton-setup.sh"])
    (rootfs / "tmp" / "triton-setup.sh").unlink()


# kubeloop sits in a layer of its own in the images that run it: a change to
# the code cost minutes of reinstalling the requirements each (the training
# image's are 4 GB of torch), and now costs one small layer.
PYTHON_IMAGES = {
    "operator": PythonImage("operator", "images/operator.txt", ImageConfig(
        entrypoint=["/usr/bin/tini", "--", "kubeloop"], cmd=["operator"], env=_PYTHON_ENV, workdir="/tmp")),
    "runtime": PythonImage("runtime", "images/runtime.txt", ImageConfig(
        entrypoint=["/usr/bin/tini", "--"], cmd=["kubeloop"], env=_PYTHON_ENV, workdir="/tmp")),
    # Training node Pods (Kubeflow Trainer's torch runtime).
    "training": PythonImage("training", "images/training.txt", ImageConfig(
        entrypoint=["/usr/bin/tini", "--"], cmd=["python"], env=_PYTHON_ENV, workdir="/tmp")),
    # Triton's own environment (numpy<2, see requirements/serving.txt).
    "triton": PythonImage("triton", "requirements/serving.txt", ImageConfig(
        entrypoint=["/usr/bin/tini", "--"], cmd=["tritonserver"], env=_PYTHON_ENV, workdir="/tmp"),
        project=False, constraints=None, debs=("libpython3.11",), finish=_lay_out_triton),
}


def project_files(root: Path) -> list[Path]:
    """What a kubeloop wheel is built from: the package under src/, through
    the symlinks that put each area folder in it, as the wheel's build
    follows them."""
    files = [root / name for name in ("pyproject.toml", "README.md")]
    for folder, dirs, names in os.walk(root / "src", followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info"))
        files += [Path(folder) / name for name in sorted(names)]
    return files


def python_image(spec: PythonImage, pip: list[str]) -> Image:
    """Build (or find in the cache) spec's image; pip is the host's pip
    command, which collects the wheels the image installs offline. An
    image of kubeloop found in the cache needs nothing of its requirements'
    image, not even its archive."""
    image = planned_image(spec)
    with _one_build(spec.name):
        if image.archive.exists():
            return image
        if spec.project:
            _project_layer(image, python_image(_requirements(spec), pip), pip)
            return image
        with tempfile.TemporaryDirectory(dir=images_dir(), prefix=f".{spec.name}-wheels-") as wheels:
            _collect_wheels(spec, pip, repo_root(), Path(wheels))
            build_image(image, lambda rootfs: _install_venv(rootfs, spec, Path(wheels)), spec.config)
    return image


def planned_image(spec: PythonImage) -> Image:
    """spec's image as its inputs name it, built or not."""
    root = repo_root()
    if spec.project:
        inputs = [planned_image(_requirements(spec)).tag.encode(), *_project_inputs(root)]
    else:
        inputs = [rootfs_archive(spec.debs).name.encode(), (root / spec.requirements).read_bytes(),
                  (root / TRITON_SETUP).read_bytes(), repr(spec.config).encode(), *_recipe()]
        if spec.constraints:
            inputs.append((root / spec.constraints).read_bytes())
    tag = image_tag(inputs)
    return Image(spec.name, tag, images_dir() / f"{spec.name}-{tag}.tar")


def _requirements(spec: PythonImage) -> PythonImage:
    """The image of spec's requirements, which kubeloop's layer goes over."""
    return replace(spec, name=f"{spec.name}-deps", project=False)


def _recipe() -> list[bytes]:
    """How an image of requirements is made, as part of its tag: the code
    that makes it, not this whole module, so a change to how kubeloop's own
    layer is made does not rebuild gigabytes of requirements."""
    steps = (extract, build_image, umoci_args, _collect_wheels, _install_venv, _lay_out_triton, _archive)
    return [inspect.getsource(step).encode() for step in steps]


def _project_inputs(root: Path) -> list[bytes]:
    return [str(p.relative_to(root)).encode() + p.read_bytes() for p in project_files(root)]


def _project_layer(image: Image, deps: Image, pip: list[str]) -> None:
    """image: deps with kubeloop installed into its venv, as one more layer
    made beside the image and inserted by umoci. The requirements' layers are
    copied, never unpacked, so a change to the code costs seconds, not the
    minutes of unpacking and repacking gigabytes of torch."""
    _need_umoci()
    with tempfile.TemporaryDirectory(dir=images_dir(), prefix=f".{image.name}-") as tmp:
        venv = _installed_project(Path(tmp), pip)
        layout = Path(tmp) / "layout"
        layout.mkdir()
        _run(["tar", "-xf", str(deps.archive), "-C", str(layout)])
        _run(["umoci", "insert", "--image", f"{layout}:{deps.tag}", "--tag", image.tag, str(venv), VENV])
        _run(["umoci", "rm", "--image", f"{layout}:{deps.tag}"])
        _run(["umoci", "gc", "--layout", str(layout)])
        _archive(layout, image)


def _installed_project(tmp: Path, pip: list[str]) -> Path:
    """kubeloop's wheel installed as the image's venv holds it, under
    tmp/venv: its scripts run the venv's Python, and its modules are compiled
    for their place in the image (no traceback names this folder)."""
    wheels, venv = tmp / "wheels", tmp / "venv"
    _run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(repo_root())])
    # --ignore-installed: the host's own (editable) kubeloop must not satisfy it.
    _run([*pip, "install", "--quiet", "--no-deps", "--no-index", "--no-compile", "--ignore-installed",
          "--no-warn-script-location", "--prefix", str(venv), *map(str, sorted(wheels.glob("*.whl")))])
    site = venv / "lib" / IMAGE_PYTHON / "site-packages"
    if not site.is_dir():
        raise ImageError(f"the images' Python is {IMAGE_PYTHON} (Debian's), but this host's pip installs for "
                         f"{', '.join(p.name for p in (venv / 'lib').iterdir())}: run `make setup` (its venv is {IMAGE_PYTHON})")
    _forget_the_wheels_path(site)
    for script in (venv / "bin").iterdir():
        lines = script.read_bytes().split(b"\n", 1)
        if lines[0].startswith(b"#!"):
            script.write_bytes(f"#!{VENV}/bin/python".encode() + b"\n" + lines[1])
    compileall.compile_dir(site, ddir=f"{VENV}/lib/{IMAGE_PYTHON}/site-packages", quiet=1,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    return venv


def _forget_the_wheels_path(site: Path) -> None:
    """pip records the wheel it installed from (direct_url.json), here a file
    in this build's folder; an image built inside its root recorded its own
    /tmp/wheels. Dropped, as if installed from an index."""
    for info in site.glob("kubeloop-*.dist-info"):
        (info / "direct_url.json").unlink(missing_ok=True)
        record = info / "RECORD"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if not line.startswith(f"{info.name}/direct_url.json,")))


@contextmanager
def _one_build(name: str) -> Iterator[None]:
    """One build of an image at a time on this machine: `make test` builds the
    images in the background while the first tests run, and a test that needs
    one meanwhile waits for that build and then finds it cached."""
    images_dir().mkdir(parents=True, exist_ok=True)
    with open(images_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _collect_wheels(spec: PythonImage, pip: list[str], root: Path, wheels: Path) -> None:
    constraints = ["-c", str(root / spec.constraints)] if spec.constraints else []
    _run([*pip, "wheel", "--quiet", "--wheel-dir", str(wheels), *constraints, "-r", str(root / spec.requirements)])
    shutil.copy(root / spec.requirements, wheels / "requirements.txt")
    if spec.constraints:
        shutil.copy(root / spec.constraints, wheels / "constraints.txt")


def _install_venv(rootfs: Path, spec: PythonImage, wheels: Path) -> None:
    """Debian's python3 makes the venv inside the root (so its paths are the
    image's own) and installs only the collected wheels: no index is asked."""
    extract(base_rootfs(spec.debs), rootfs)
    inside = rootfs / "tmp" / "wheels"
    shutil.copytree(wheels, inside)
    _run(["chroot", str(rootfs), "/usr/bin/python3", "-m", "venv", VENV])
    pip = ["chroot", str(rootfs), f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--no-cache-dir",
           "--find-links", "/tmp/wheels"]
    constraints = ["-c", "/tmp/wheels/constraints.txt"] if spec.constraints else []
    _run([*pip, *constraints, "-r", "/tmp/wheels/requirements.txt"])
    shutil.rmtree(inside)
    if spec.finish:
        spec.finish(rootfs)


def builders(pip: list[str]) -> dict[str, Callable[[], Image]]:
    """How to build (or find in the cache) each image the real node uses, by name."""
    found: dict[str, Callable[[], Image]] = {"pause": pause_image, "base": base_image}
    for name, spec in PYTHON_IMAGES.items():
        found[name] = lambda spec=spec: python_image(spec, pip)
    return found


def build_all(pip: list[str], names: list[str] | None = None) -> list[tuple[Image, float]]:
    """The named images (default: all), each with the seconds its build took
    (near zero when it came from the cache)."""
    available = builders(pip)
    unknown = sorted(set(names or ()) - set(available))
    if unknown:
        raise ImageError(f"no image named {', '.join(unknown)}; the images are {', '.join(available)}")
    built = []
    for name in names or available:
        started = time.monotonic()
        image = available[name]()
        built.append((image, time.monotonic() - started))
    return built


def build_image(image: Image, populate: Callable[[Path], None], config: ImageConfig) -> None:
    """Assemble image.archive: an empty OCI image, unpacked, filled by
    populate(rootfs), repacked as its layer, configured and tarred."""
    _need_umoci()
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
        _archive(layout, image)


def _need_umoci() -> None:
    if shutil.which("umoci") is None:
        raise ImageError("umoci is not installed; run `make setup` (it installs Debian's umoci)")


def _archive(layout: Path, image: Image) -> None:
    """image.archive from an OCI layout, in one rename (a build cut off leaves
    no archive behind that looks whole)."""
    partial = image.archive.with_suffix(".partial")
    with tarfile.open(partial, "w") as archive:
        for entry in sorted(layout.iterdir()):
            archive.add(entry, arcname=entry.name)
    partial.rename(image.archive)
    # Only the newest build of each image is kept: older ones are never used again.
    for older in images_dir().glob(f"{image.name}-*.tar"):
        # (not another image whose name begins with this one's: training-deps)
        if older != image.archive and older.stem.rsplit("-", 2)[0] == image.name:
            older.unlink()


def _run(argv: list[str], cwd: Path | None = None, env_extra: dict[str, str] | None = None) -> None:
    env = {**os.environ, **(env_extra or {})}
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageError(f"{' '.join(argv[:3])} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
