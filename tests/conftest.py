"""Shared test set-up. Tests marked `root` need root: they run in CI (root) and skip elsewhere with the
reason; as root, a skipped root test fails the run.

Tests marked `peers` need what `make test` builds (the real engines of tests/peers, the nspawn root of
tests/nspawn): `make test` runs the others while those build, then these. A test that uses the `servers`,
`containers` or `docker_engine` fixture is marked by itself; a module that needs them otherwise says so.

`make test` runs each step on two workers (pytest-xdist, `--dist loadgroup`); tests of one group run one after
another on one worker. First step: most tests wait on a daemon child process, not the CPU; those that share
something of the host are the group `host` (HOST_MODULES), the others run one by one on whichever worker is free.
Second step: two lanes (PEERS_LANES), the engines the tests start themselves beside the engines in containers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paths import CORPUS

IS_ROOT = os.geteuid() == 0


PEERS_FIXTURES = {"servers", "containers", "docker_engine"}
# What two tests running at once would share, by module (its path under tests/) or fixture: the host's kernel log
# and journal (a test's lines read by another's daemon, or counted), the unprivileged user gwattacker (created
# once per worker, its home emptied after each test). Discovery sees every engine-like server of the host: a test
# daemon discovers only when its test asks (helpers.Daemon), and those tests count only their own engines.
HOST_MODULES = {"integration/test_kernel_handover.py", "integration/test_kernel_sources.py",
                "integration/test_systemd.py", "security/test_attack_kernel_lines.py"}
HOST_FIXTURES = {"journald", "attacker", "attacker_account"}
# The second step's lanes: every engine runs on core 0 (tests/peers/engines.py), so two lanes at most. The
# engines the tests start themselves (vLLM, llama.cpp; they share the journald fixture and vLLM's compile cache)
# beside the engines in Docker containers, in the nspawn systemd and under test_restart.py's supervisor. Their
# kernel lines name different GPUs, and a discovering daemon counts only its own engine's events.
PEERS_LANES = {"integration/test_docker.py": "containers", "integration/test_real_systemd.py": "containers",
               "integration/test_restart.py": "containers"}
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        module = item.path.relative_to(TESTS).as_posix()
        if PEERS_FIXTURES & fixtures:
            item.add_marker(pytest.mark.peers)
        if item.get_closest_marker("peers"):
            item.add_marker(pytest.mark.xdist_group(PEERS_LANES.get(module, "engines")))
        elif HOST_FIXTURES & fixtures or module in HOST_MODULES:
            item.add_marker(pytest.mark.xdist_group("host"))
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
