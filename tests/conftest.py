"""Shared test set-up. Tests marked `root` need root: they run in CI (root) and skip elsewhere with the
reason; as root, a skipped root test fails the run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paths import CORPUS

IS_ROOT = os.geteuid() == 0


def pytest_collection_modifyitems(config, items):
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
