"""Shared test set-up. Tests marked `root` need root: they run in CI (root) and skip elsewhere with the
reason; as root, any skipped test fails the run (a test that truly cannot run on a host says why in its skip,
and CI, which runs as root, must not pass without it).

Tests marked `peers` need what `make test` builds (the real engines of tests/peers, the nspawn root of
tests/nspawn): `make test` runs the others while those build, then these. A test that uses the `servers`,
`containers` or `docker_engine` fixture is marked by itself; a module that needs them otherwise says so.

`make test` runs each step on two workers (pytest-xdist, `--dist loadgroup`); the tests of one group (GROUPS, by
module) run one after another on one worker, every other test on whichever worker is free. First step: most
tests wait on a daemon child process, not the CPU; those that share something of the host are the group `host`.
Second step: two lanes, vLLM's tests beside llama.cpp's, each kind of engine on a core of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import gpuwarden.alert.runbooks  # the domain fills the registry config validates names against, as cli.py does
import gpuwarden.kernel.rules  # noqa: F401
from paths import CORPUS
from peers.engines import lane

IS_ROOT = os.geteuid() == 0


PEERS_FIXTURES = {"servers", "containers", "docker_engine"}
# By path under tests/ (a folder ends with "/"). Step 1, `host`: what two tests at once would share: the host's
# kernel log and journal (a test's lines read by another's daemon, or counted: write_kmsg, the journald fixture),
# the user gwattacker-<random> (created once per worker, its home emptied after each test: the attacker fixtures).
# Discovery sees every engine-like server of the host: a test daemon discovers only when its test asks
# (helpers.Daemon), and those tests count only their own engines.
# Step 2, a lane per engine kind (LANES), each kind on a core of its own (tests/peers/engines.py core()): the
# tests whose names say vLLM in one, llama.cpp's (as processes, in containers, in the nspawn systemd) in the
# other, so no two engines ever compute on one core. Their kernel lines name different GPUs, and a discovering
# daemon counts only its own engine's events. ENGINES: the modules whose tests are split by their names.
LANES = ("vllm", "llamacpp")
ENGINES = "by engine"
GROUPS = {"security/": "host", "security/test_attack_saturation.py": "llamacpp",
          "integration/test_kernel_handover.py": "host", "integration/test_kernel_rebuilt.py": "host",
          "integration/test_kernel_sources.py": "host", "integration/test_kernel_clock.py": "host",
          "integration/test_systemd.py": "host",
          "integration/test_real_engines.py": ENGINES, "integration/test_real_engines_logs.py": ENGINES,
          "integration/test_real_prefill.py": ENGINES, "integration/test_restart.py": ENGINES,
          "integration/test_box_on_fire.py": ENGINES,
          "integration/test_docker.py": "llamacpp", "integration/test_real_systemd.py": "llamacpp",
          "integration/test_golden_docker.py": "llamacpp", "integration/test_image.py": "llamacpp"}
HOST_FIXTURES = {"journald", "attacker", "attacker_account"}
TESTS = Path(__file__).parent


def group(nodeid: str) -> str | None:
    """The group of a test, by its id under tests/ (or under the rootdir: tests/...): its module's, or in a module
    split by engine, the lane its name says."""
    path, _, name = nodeid.removeprefix("tests/").partition("::")
    found = GROUPS.get(path) or GROUPS.get(path.split("/", 1)[0] + "/")
    return lane(name) if found == ENGINES else found


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if PEERS_FIXTURES & fixtures:
            item.add_marker(pytest.mark.peers)
        where = group(f"{item.path.relative_to(TESTS).as_posix()}::{item.name}") \
            if item.path.is_relative_to(TESTS) else None
        if item.get_closest_marker("peers"):
            grouped = where in LANES
        else:  # a module that writes the kernel log imports helpers.write_kmsg
            shares = HOST_FIXTURES & fixtures or hasattr(getattr(item, "module", None), "write_kmsg")
            grouped = where == "host" or not shares
        if not grouped:
            raise pytest.UsageError(f"{item.nodeid}: its module needs a group in GROUPS of tests/conftest.py")
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (writes /dev/kmsg, starts journald, makes mount namespaces)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


class GroupsByModule:
    """--dist loadgroup with the groups of GROUPS. (xdist 3.8 marks an `xdist_group` by a suffix to the test's
    id, which pytest 9 no longer takes: its groups would be lost.)"""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadGroupScheduling

        class ByModule(LoadGroupScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return group(nodeid) or nodeid
        return ByModule(config, log)


def pytest_configure(config):
    global _worker
    _worker = hasattr(config, "workerinput")  # not $PYTEST_XDIST_WORKER: a pytest that a worker's test runs has it
    if config.pluginmanager.hasplugin("xdist"):  # `-p no:xdist` runs everything in one process
        config.pluginmanager.register(GroupsByModule(), "gpuwarden-groups")


SKIPPED_AS_ROOT = "skipped while running as root (CI must run every test)"
_skipped_modules: list[str] = []
_worker = False  # an xdist worker: its controller hears its reports and ends the run


def _reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """As root (CI), a skipped test fails, with the reason it gave; an expected failure (xfail, reported as
    skipped) is no skip."""
    outcome = yield
    report = outcome.get_result()
    if IS_ROOT and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"{SKIPPED_AS_ROOT}: {_reason(report)}"


def pytest_collectreport(report):
    """A whole module skipped (pytest.skip(allow_module_level=True), importorskip): it fails the run at its end,
    not its collection (a collection error would stop every other test). Under xdist the controller hears the
    workers' reports."""
    if IS_ROOT and report.skipped and not _worker:
        _skipped_modules.append(f"{report.nodeid}: {_reason(report)}")


def pytest_sessionfinish(session, exitstatus):
    if _skipped_modules and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _skipped_modules:
        terminalreporter.section(f"modules {SKIPPED_AS_ROOT}", red=True)
        for module in _skipped_modules:
            terminalreporter.write_line(f"FAILED {module}", red=True)


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.fail(f"the test corpus is missing at {CORPUS}")
    return CORPUS
