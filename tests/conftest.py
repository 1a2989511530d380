"""Shared test set-up. Tests marked `root` need root: they run in CI (root) and skip elsewhere with the
reason; as root, a skipped root test fails the run.

Tests marked `peers` need what `make test` builds (the real engines of tests/peers, the nspawn root of
tests/nspawn): `make test` runs the others while those build, then these. A test that uses the `servers`,
`containers` or `docker_engine` fixture is marked by itself; a module that needs them otherwise says so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import gpuwarden.alert.runbooks  # the domain fills the registry config validates names against, as cli.py does
import gpuwarden.kernel.rules  # noqa: F401
from paths import CORPUS

IS_ROOT = os.geteuid() == 0


PEERS_FIXTURES = {"servers", "containers", "docker_engine"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if PEERS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.peers)
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (writes /dev/kmsg, starts journald, makes mount namespaces)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IS_ROOT and "root" in item.keywords and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"root test skipped while running as root: {report.longrepr}"


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.fail(f"the test corpus is missing at {CORPUS}")
    return CORPUS
