"""kubeloop's own layer of the cluster images (operator, runtime, training),
made on this host beside the image instead of inside an unpacked root. The
images themselves are proven by the real node's tests, whose Pods run them;
this pins what the layer holds."""

from __future__ import annotations

import marshal
import sys

from kubeloop.dev import images

SITE = f"{images.VENV}/lib/{images.IMAGE_PYTHON}/site-packages"


def test_kubeloops_layer_runs_the_images_python_and_names_only_the_images_paths(tmp_path):
    """Cluster path (the images' layer): the console script runs the venv's
    Python in the image, every module is compiled for where it sits there
    (a traceback in a Pod names /opt/kubeloop, never this build's folder),
    the compiled modules are checked against their source by hash (the
    layer's mtimes do not matter), and the area folders the wheel follows
    (pipelines, components) are in it."""
    venv = images._installed_project(tmp_path, [sys.executable, "-m", "pip"])
    assert (venv / "bin" / "kubeloop").read_text().splitlines()[0] == f"#!{images.VENV}/bin/python"
    site = venv / "lib" / images.IMAGE_PYTHON / "site-packages"
    compiled = sorted((site / "kubeloop").rglob("*.pyc"))
    sources = sorted((site / "kubeloop").rglob("*.py"))
    assert len(compiled) == len(sources) > 100
    for pyc in compiled[:: max(1, len(compiled) // 20)]:
        data = pyc.read_bytes()
        assert int.from_bytes(data[4:8], "little") == 0b11, pyc  # hash-based, checked
        filename = marshal.loads(data[16:]).co_filename
        assert filename.startswith(f"{SITE}/kubeloop/") and str(tmp_path) not in filename, filename
    assert (site / "kubeloop" / "pipelines").is_dir() and (site / "kubeloop" / "components").is_dir()
    for path in venv.rglob("*"):
        if path.is_file() and path.suffix != ".pyc":
            assert str(tmp_path).encode() not in path.read_bytes(), path
