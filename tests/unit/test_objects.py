"""Files handed between steps: local paths here (s3:// is proven where a
node Pod reads and writes the object store, tests/e2e/test_real_node.py)."""

from __future__ import annotations

import re

import pytest

from kubeloop.components.objects import download, upload


def test_a_local_file_goes_up_and_comes_back(tmp_path):
    (tmp_path / "a").write_bytes(b"weights")
    upload(tmp_path / "a", str(tmp_path / "store" / "model" / "state.pt"))
    assert not list((tmp_path / "store" / "model").glob(".*"))  # no partial left behind
    assert download(str(tmp_path / "store" / "model" / "state.pt"), tmp_path / "back" / "b").read_bytes() == b"weights"


@pytest.mark.parametrize("uri", ["gs://bucket/key", "s3://bucket", "s3:///key"])
def test_an_unsupported_or_incomplete_uri_is_named(tmp_path, uri):
    (tmp_path / "a").write_bytes(b"x")
    with pytest.raises(ValueError, match=re.escape(uri)):
        upload(tmp_path / "a", uri)
