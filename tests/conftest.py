"""Shared fixtures. The live platform (a real control plane with the fake GPU
fleet) is started once per test session and only when a test asks for it.
Set KUBELOOP_TEST_STATE_DIR to reuse a platform that is already up (it is
then left running)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubeloop.dev.platform import Platform
from tests.support.namespaces import create_namespace, delete_namespace

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory):
    reuse = os.environ.get("KUBELOOP_TEST_STATE_DIR")
    if reuse and Platform(Path(reuse)).running():
        reused = Platform(Path(reuse))
        reused.install_crds()  # the API may have changed since it came up
        yield reused
        return
    instance = Platform(tmp_path_factory.mktemp("platform"))
    instance.up()
    try:
        yield instance
    finally:
        instance.down()


@pytest.fixture(scope="session")
def kube(platform: Platform):
    client = platform.kube()
    yield client
    client.close()


@pytest.fixture
def namespace(kube) -> str:
    """A fresh namespace per test, so tests never see each other's objects."""
    name = create_namespace(kube)
    yield name
    delete_namespace(kube, name)
