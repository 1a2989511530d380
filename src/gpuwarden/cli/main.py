"""The `gpuwarden` command. Exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 `replay` found a critical
event, 78 configuration error, 141 standard output closed early (`| head`), as a tool that SIGPIPE ended.

JSON, the same way in every command: `--json` prints one JSON document and nothing else on standard output;
`--jsonl` (the commands that list rows: events, incidents, replay) one JSON object per line as rows come."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import gpuwarden.alert.runbooks  # fills the registry that config checks runbook names against
import gpuwarden.kernel.rules  # noqa: F401  (and rule names)
from gpuwarden import __version__, enginekinds
from gpuwarden.config import settings as configuration
from gpuwarden.config.settings import ConfigError, parse_duration
from gpuwarden.core.counts import plural
from gpuwarden.core.model import HISTORY, LOGGED_AT
from gpuwarden.runtime import logsetup
from gpuwarden.runtime.logsetup import redact
from gpuwarden.store.sqlite import Store, StoreError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CONFIG, EXIT_PIPE = 0, 1, 2, 78, 141
EXIT_CRITICAL = 3  # replay found a critical event: a status no usage error (2) shares, so a script can tell
LOG_LEVELS = ("debug", "info", "warning", "error")
SEVERITIES = ("info", "warning", "critical")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"gpuwarden: configuration error:\n{exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreError as exc:
        print(f"gpuwarden: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_FAILURE
    except BrokenPipeError:
        # the reader went away (`| head -1`): say nothing more, and keep the interpreter's final flush of
        # standard output from raising again on its way out
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE


def _seconds(text: str) -> float:
    """A --timeout: a finite number of seconds above zero (0 or less would answer before asking)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1")
    return value


def _since(text: str) -> float:
    """A --since or --until: a duration back from now (90s, 1h, 2d, 1w), `today` or `yesterday` (from local
    midnight), or a time (2026-12-04 09:30, 2026-12-04T09:30:00+00:00, local time unless it says its zone); the
    epoch seconds it means."""
    try:
        return time.time() - parse_duration(text)
    except ValueError:
        pass
    days = {"today": 0, "yesterday": 1}.get(text.strip().lower())
    if days is not None:
        midnight = datetime.now().replace(hour=0, minute=0, second=0, microsecond=0)
        return (midnight - timedelta(days=days)).timestamp()
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a duration (90s, 1h, 2d, 1w), today, yesterday, nor "
                                         "a time (2026-12-04 09:30, 2026-12-04T09:30:00+00:00)") from None


def _json_forms(parser: argparse.ArgumentParser) -> None:
    forms = parser.add_mutually_exclusive_group()
    forms.add_argument("--json", action="store_true", help="one JSON document (an array of rows)")
    forms.add_argument("--jsonl", action="store_true", help="one JSON object per line, as rows come")


def _emit(args: argparse.Namespace, rows, text) -> int:
    """Rows as --json (one array), --jsonl (a line each, as they come) or text (`text(row)` a line each);
    the number of rows."""
    count, collected = 0, []
    for row in rows:
        count += 1
        if args.json:
            collected.append(row)
        else:
            print(json.dumps(row, default=str) if args.jsonl else text(row), flush=args.jsonl)
    if args.json:
        print(json.dumps(collected, default=str))
    return count


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuwarden", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    config_help = f"configuration file (default {configuration.DEFAULT_PATH})"
    parser.add_argument("--config", type=Path, help=config_help)
    # --config after the subcommand too (`gpuwarden check --config FILE`); SUPPRESS keeps one given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=config_help)
    subparsers = parser.add_subparsers(dest="command")

    def command(name: str, **kw) -> argparse.ArgumentParser:
        return subparsers.add_parser(name, parents=[common], **kw)

    run = command("run", help="run the daemon in the foreground")
    run.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS,
                     help="instead of [daemon] log_level (kept across reloads)")
    run.set_defaults(handler=cmd_run)
    reload = command("reload", help="make a running daemon re-read its configuration, and wait until it has")
    reload.add_argument("--pid", type=int, help="the daemon's pid (systemd: $MAINPID); default: the one gpuwarden "
                                                "daemon running with this configuration's state_dir")
    reload.add_argument("--timeout", type=_seconds, default=20.0, help="seconds to wait (default 20)")
    reload.set_defaults(handler=cmd_reload)
    check = command("check", help="validate the configuration: one line when valid, else each error with its line")
    check.add_argument("file", nargs="?", type=Path, help="the configuration file (same as --config)")
    check.add_argument("--show", action="store_true", help="print the effective configuration too, and what a "
                                                           "kill of each engine would take now")
    check.add_argument("--json", action="store_true", help="one JSON document: the file, the effective "
                                                           "configuration, what a kill of each engine would take")
    check.set_defaults(handler=cmd_check)

    events = command("events", help="recent events from the store")
    _json_forms(events)
    events.add_argument("--since", type=_since, default="24h",
                        help="how far back: a duration (90s, 1h, 2d, 1w), today, yesterday or a time "
                             "(2026-12-04 09:30) (default 24h)")
    events.add_argument("--until", type=_since, help="up to when (the same forms: yesterday, 2h, a time); "
                                                     "default now")
    events.add_argument("--kind", action="append", help="only this kind (again for more: --kind xid --kind ...)")
    events.add_argument("--gpu", action="append", help="only events about this GPU (its PCI address)")
    events.add_argument("--engine", action="append", help="only events about this engine")
    events.add_argument("--severity", choices=SEVERITIES, help="only events at this severity or above")
    events.add_argument("--limit", type=_positive, default=1000, help="at most this many, the newest (default 1000; "
                                                                      "how many were left out is said)")
    events.set_defaults(handler=cmd_events)

    replay = command("replay", help="classify saved kernel logs and print the events (exit 3: a critical one)")
    replay.add_argument("files", nargs="+", help="log files; - reads standard input")
    _json_forms(replay)
    replay.set_defaults(handler=cmd_replay)

    probe = command("probe", help="scrape an engine's /metrics once and say what it shows; --canary: ask it for a "
                                   "token as the daemon's canary does, and say what is missing")
    probe.add_argument("url", nargs="?", help="e.g. http://127.0.0.1:8000/metrics (or --engine)")
    probe.add_argument("--engine", help="a configured engine: its metrics_url, and its canary's settings")
    probe.add_argument("--canary", action="store_true",
                       help="also send one real one-token completion, with the key, headers, model and route the "
                            "daemon's canary would use (exit 1 when it does not complete)")
    probe.add_argument("--json", action="store_true", help="one JSON document")
    probe.add_argument("--profile", default="auto", choices=("auto", *enginekinds.names()),
                       help="the engine kind whose metrics to read (default: the one the body shows)")
    probe.add_argument("--timeout", type=_seconds, default=5.0, help="seconds (default 5)")
    probe.set_defaults(handler=cmd_probe)

    status = command("status", help="the running daemon's state: sources, engines, open incidents, GPUs (without "
                                     "a daemon: a fresh reading of every GPU)")
    status.add_argument("--json", action="store_true", help="one JSON document")
    status.add_argument("--timeout", type=_seconds, default=5.0, help="seconds to wait for the daemon (default 5)")
    status.set_defaults(handler=cmd_status)

    guard = command("guard", help="the recovery guard outside the daemon: status, apply, release")
    guard.add_argument("action", choices=("status", "apply", "release"))
    guard.add_argument("--json", action="store_true", help="one JSON document")
    guard.set_defaults(handler=cmd_guard)

    quarantine = command("quarantine", help="move poisoned compile caches aside (renamed, never deleted)")
    quarantine.add_argument("dirs", nargs="*", type=Path,
                            help="cache directories to move (default: those of [cache] dirs with zero-byte files)")
    quarantine.add_argument("--reason", default="manual", help="goes into the new name (default: manual)")
    quarantine.add_argument("--dry-run", action="store_true", help="say what would move, move nothing")
    quarantine.set_defaults(handler=cmd_quarantine)

    doctor = command("doctor", help="preflight: BARs, PCIe paths, AtomicOps, NUMA, IOMMU, settings, caches")
    doctor.add_argument("--json", action="store_true", help="one JSON document")
    doctor.set_defaults(handler=cmd_doctor)

    incidents = command("incidents", help="the incident reports (state_dir/incidents)")
    _json_forms(incidents)
    incidents.set_defaults(handler=cmd_incidents)

    conditions = command("conditions", help="what is wrong now: the open conditions (docs/conditions.md)")
    _json_forms(conditions)
    conditions.set_defaults(handler=cmd_conditions)

    npd = command("npd-check", help="node-problem-detector custom plugin: exit 0 ok, 1 problem, 2 unknown")
    npd.add_argument("--condition", choices=("gpu", "engine", "daemon"), default="gpu",
                     help="gpu: a GPU lost since boot; engine: an engine problem left unfixed (open conditions, "
                          "docs/conditions.md); daemon: gpuwarden down or failing (default gpu)")
    npd.add_argument("--window", help=argparse.SUPPRESS)  # ignored: NPD configs written before conditions pass it
    npd.add_argument("--timeout", type=_seconds, default=4.0,
                     help="seconds for the whole check (default 4, NPD's is 5)")
    npd.set_defaults(handler=cmd_npd_check)

    command("test-alert", help="send a test message to every alert target").set_defaults(
        handler=cmd_test_alert)

    install = command("install", help="place the systemd unit, the example configuration (an existing one is kept), "
                                      "the man page, the bash completion and gpuwarden on PATH (a link)")
    install.add_argument("--root", type=Path, default=Path("/"),
                         help="install below this folder, as a packager stages (DESTDIR; default /)")
    install.add_argument("--prefix", default="/usr/local",
                         help="where the man page, the completion and the link go, below --root (default "
                              "/usr/local)")
    install.add_argument("--exec", dest="exe", metavar="PATH",
                         help="the gpuwarden the unit starts (default: this one)")
    install.set_defaults(handler=cmd_install)
    uninstall = command("uninstall", help="the reverse of install: stop and disable the service, remove the unit, "
                                          "the man page, the completion and the link; keep the configuration and "
                                          "the store")
    uninstall.add_argument("--root", type=Path, default=Path("/"), help="as install's --root (default /)")
    uninstall.add_argument("--prefix", default="/usr/local", help="as install's --prefix (default /usr/local)")
    uninstall.set_defaults(handler=cmd_uninstall)
    command("man", help="print the man page, gpuwarden(1), in roff").set_defaults(handler=cmd_man)
    completion = command("completion", help="print the shell completion script: source <(gpuwarden completion bash)")
    completion.add_argument("shell", choices=("bash",), help="the shell (bash)")
    completion.set_defaults(handler=cmd_completion)
    return parser


EXAMPLES = [  # the man page's EXAMPLES: what a new user does first, then what an on-call engineer asks
    ("gpuwarden check /etc/gpuwarden/gpuwarden.toml", "Validate the configuration: one line when it is valid, "
     "else each error with its line, cause and fix. Add --show for the effective configuration."),
    ("gpuwarden test-alert", "Send a test message to every alert target, and say which answered."),
    ("gpuwarden status", "Ask the running daemon what it watches: sources, engines, open incidents, GPUs."),
    ("gpuwarden events --since yesterday --severity warning", "The events since yesterday's midnight, warnings "
     "and worse."),
    ("gpuwarden events --since 1w --until 1d --kind xid --jsonl", "Last week's Xid events, one JSON object per "
     "line."),
    ("gpuwarden incidents", "The incident reports: what broke, what gpuwarden did, and each one's folder."),
    ("journalctl -k -b -1 | gpuwarden replay -", "Classify the last boot's kernel log; exit status 3 when it "
     "holds a critical event."),
    ("gpuwarden probe http://127.0.0.1:8000/metrics", "Scrape an engine once: what it runs, and the processes "
     "a kill would take."),
    ("sudo gpuwarden install", "Place the systemd unit, the configuration, the man page, the completion and "
     "gpuwarden on PATH, and say the next step; sudo gpuwarden uninstall takes them away again, keeping the "
     "configuration."),
]


def _man_page() -> str:
    from gpuwarden.cli import reference as cliref

    files = [(str(configuration.DEFAULT_PATH), "the configuration (0600: it holds the alert URLs' tokens)"),
             ("/var/lib/gpuwarden", "the event store, incident reports and the reload confirmation (0700)"),
             ("/etc/systemd/system/gpuwarden.service", "the systemd unit `gpuwarden install` places")]
    return cliref.man(_parser(), __version__, files, EXAMPLES)


def cmd_man(args: argparse.Namespace) -> int:
    sys.stdout.write(_man_page())
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    from gpuwarden.cli import reference as cliref

    sys.stdout.write(cliref.bash_completion(_parser()))
    return EXIT_OK


def cmd_install(args: argparse.Namespace) -> int:
    from gpuwarden.cli import install
    from gpuwarden.cli import reference as cliref

    try:
        placed = install.install(args.root, args.prefix, args.exe or install.executable(), _man_page(),
                                 cliref.bash_completion(_parser()))
    except (LookupError, ValueError, OSError) as exc:
        print(f"gpuwarden install: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    for done in placed:
        if done.target:
            print(f"linked {done.path} -> {done.target} (the gpuwarden command on PATH)")
        else:
            print(f"{'kept the existing' if done.kept else 'placed'} {done.path} (mode {done.mode:o})")
    where = "next" if args.root == Path("/") else f"next, on the system this stage ({args.root}) is for"
    print(f"{where}: put your alert URLs in /{install.CONFIG} (and your engines, or leave them to discovery),\n"
          "  then: gpuwarden check && gpuwarden test-alert\n"
          "  and start it, now and at every boot: systemctl daemon-reload && systemctl enable --now gpuwarden")
    return EXIT_OK


def cmd_uninstall(args: argparse.Namespace) -> int:
    """The reverse of `install`: the service stopped and disabled (on this system), the unit, man page,
    completion and link removed; the configuration and the event store kept, and said so."""
    import shutil
    import subprocess

    from gpuwarden.cli import install

    if args.root == Path("/") and Path("/run/systemd/system").is_dir() and shutil.which("systemctl"):
        try:
            done = subprocess.run(["systemctl", "disable", "--now", "gpuwarden"], capture_output=True, text=True,
                                  timeout=60)  # a stop waits for the daemon's own bounded shutdown
        except subprocess.TimeoutExpired:
            print("gpuwarden uninstall: systemctl disable --now gpuwarden did not finish in 60 s: nothing removed",
                  file=sys.stderr)
            return EXIT_FAILURE
        if done.returncode == 0:
            print("stopped and disabled gpuwarden.service")
        elif "does not exist" not in done.stderr and "not loaded" not in done.stderr:
            print(f"gpuwarden uninstall: systemctl disable --now gpuwarden: {done.stderr.strip()}: nothing removed",
                  file=sys.stderr)
            return EXIT_FAILURE
    try:
        removed = install.uninstall(args.root, args.prefix)
    except OSError as exc:
        print(f"gpuwarden uninstall: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    for path in removed:
        print(f"removed {path}")
    if not removed:
        print(f"nothing to remove: no file of `gpuwarden install --root {args.root} --prefix {args.prefix}` is there")
    if args.root == Path("/") and removed and shutil.which("systemctl") and Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "daemon-reload"], capture_output=True, timeout=60)
    print(f"kept {args.root / install.CONFIG} (your configuration) and the state dir (the event store, incident "
          "reports): remove them yourself if you want them gone")
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from gpuwarden.daemon import Daemon

    config, path = configuration.load(args.config)
    logsetup.setup(args.log_level or config.daemon.log_level)
    import logging

    logging.getLogger("gpuwarden").info("gpuwarden %s starting with %s", __version__, path or "built-in defaults")
    try:
        rc = asyncio.run(Daemon(config, args.config, log_level=args.log_level).run())
    except OSError as exc:
        logging.getLogger("gpuwarden").error("cannot run: %s", exc)
        return EXIT_FAILURE
    # Stopped: the store is closed and the guard released. What still runs is abandoned I/O (a send that hangs
    # in apprise's own thread pool) that a normal interpreter exit would wait for: end here instead.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def cmd_reload(args: argparse.Namespace) -> int:
    """ExecReload: returns when the daemon has re-read its configuration; 78 when it refused it."""
    from gpuwarden.runtime import reloads

    try:
        pid = args.pid or reloads.find_daemon(configuration.load(args.config)[0].daemon.state_dir)
        done = reloads.request(pid, args.timeout)
    except (LookupError, TimeoutError, OSError) as exc:
        print(f"gpuwarden reload: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if not done["ok"]:
        print(f"gpuwarden reload: the running configuration stays:\n{done['error']}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"gpuwarden reload: reloaded {done['config']}")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    """As `nginx -t` and `promtool check`: one line when the file is valid, each warning after it with its line;
    an invalid file exits 78 with each error's line, cause and fix, top to bottom. --show adds the effective
    configuration and what a kill of each engine would take now."""
    from gpuwarden.alert.targets import build
    from gpuwarden.engine.parts import target_spec

    if args.file and args.config and args.file != args.config:
        print(f"gpuwarden check: two files given ({args.file} and --config {args.config})", file=sys.stderr)
        return EXIT_USAGE
    config, path = configuration.load(args.file or args.config)
    try:
        targets = build(config.alerts)  # what `run` does with the alert URLs and apprise config file
    except ConfigError as exc:
        raise configuration.placed(exc, path) from None
    warnings = configuration.in_line_order(_warnings(config), path)
    if args.json:
        engines = {}
        for engine in config.engine:
            processes, refused = _resolution(target_spec(engine))
            engines[engine.name] = {"processes": processes, "refused": refused}
        print(json.dumps({"file": str(path) if path else None, "valid": True, "warnings": warnings,
                          "config": config.dump(), "kill_would_take": engines}))
        return EXIT_OK
    counted = (f"{len(config.engine)} engine{'' if len(config.engine) == 1 else 's'}" if config.engine
               else "engines: discovered" if config.engines.discover else "no engine")
    print(f"{path or 'no configuration file: the built-in defaults'}: valid ({counted}, {len(targets)} alert "
          f"target{'' if len(targets) == 1 else 's'}, kernel source {config.kernel.source}"
          f"{f', {len(warnings)} warning' + ('' if len(warnings) == 1 else 's') if warnings else ''})")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.show:
        print(json.dumps(_effective(config, targets), indent=2, ensure_ascii=False))  # secrets masked
        for engine in config.engine:
            print(f"# engine {engine.name}: a kill now would take")
            _print_processes(*_resolution(target_spec(engine)))
    return EXIT_OK


def _warnings(config: configuration.Config) -> list[tuple[tuple, str]]:
    """What is valid but likely not what was meant, as (key, why): `run` would go on, missing something."""
    from gpuwarden.gpu.discovery import discover

    found: list[tuple[tuple, str]] = []
    if config.kernel.source == "file":
        found.append((("kernel", "source"), f"\"file\" ({config.kernel.file}) cannot tell a kernel line from one any "
                      "user writes with `logger -t kernel`: a GPU fault read from it may be forged. /dev/kmsg and "
                      "the journal can tell: prefer source = \"auto\""))
    if config.kernel.source == "file" and not config.kernel.file.exists():
        found.append((("kernel", "file"), f"{config.kernel.file} does not exist: no kernel line is read until it "
                      "does (Debian 12 writes none there without rsyslog; source = \"auto\" reads /dev/kmsg)"))
    for i, engine in enumerate(config.engine):
        if engine.source == "log" and engine.log_file is not None and not engine.log_file.exists():
            found.append((("engine", i, "log_file"), f"{engine.log_file} does not exist: {engine.name}'s progress "
                          "is not read until it does"))
    present = {gpu.pci for gpu in discover(config.gpu.sysfs_root)}
    here = (f"this box has {', '.join(sorted(present))}" if present
            else f"no GPU is found under {config.gpu.sysfs_root}")
    for i, engine in enumerate(config.engine):
        for j, gpu in enumerate(engine.gpus):
            if gpu not in present:
                found.append((("engine", i, "gpus", j), f"GPU {gpu} is not on this box ({here}): a fault of "
                              f"the GPU {engine.name} really uses would not be matched to it. Fix the address, or "
                              "leave gpus out (learned from the device files the engine holds)"))
    # said where a password is at stake (a web config): on the defaults every check would warn, and be ignored
    if (config.exporter.enabled and config.exporter.web_config_file
            and config.exporter.port >= (start := _unprivileged_ports())):
        found.append((("exporter", "port"), f"{config.exporter.port} is unprivileged here: while gpuwarden is down (a "
                      "restart, a boot) any local user may take it, and Prometheus then scrapes that user's answers "
                      f"and sends it its password. A port below {start} (net.ipv4.ip_unprivileged_port_start) only "
                      "root can take: docs/security.md"))
    for j, gpu in enumerate(config.guard.devices):
        if gpu not in present:
            found.append((("guard", "devices", j), f"GPU {gpu} is not on this box ({here}): nothing to guard there"))
    return found


def _effective(config: configuration.Config, targets) -> dict:
    """The configuration as `run` will use it: defaults that depend on the box resolved (the guard, the
    caches, the alert targets' names), keys left unset left out rather than printed as null."""
    from gpuwarden.act.quarantine import cache_dirs

    shown = config.dump()
    shown["guard"]["enabled"] = config.guard.enabled if config.guard.enabled is not None else os.geteuid() == 0
    shown["cache"]["dirs"] = [str(d) for d in cache_dirs(config.cache)]
    named = iter(t.name for t in targets[len(config.alerts.urls):])
    for target in shown["alerts"]["target"]:
        target["name"] = next(named)

    def set_only(value):
        if isinstance(value, dict):
            return {k: set_only(v) for k, v in value.items() if v is not None}
        return [set_only(v) for v in value] if isinstance(value, list) else value
    return set_only(shown)


def _unprivileged_ports() -> int:
    """The first port any user may bind (Linux's default 1024; a container runtime may lower it, even to 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024


def _resolution(spec) -> tuple[list[str], list[str]]:
    """What a target resolves to now, as a kill would take it ("pid user command"), and what it refuses."""
    return _resolved(spec)[1:]


def _resolved(spec):
    """The processes a target resolves to now, those described ("pid user command"), and what it refuses."""
    from gpuwarden.engine.processes import Tracker, describe, resolve

    found = resolve(spec)
    procs = Tracker().refresh(found)
    return procs, [describe(p) for p in procs], found.refused


def _print_processes(procs: list[str], refused: list[str]) -> None:
    for line in procs:
        print(f"#   {line}")
    for why in refused:
        print(f"#   refused {why}")
    if not procs and not refused:
        print("#   no process")


def cmd_events(args: argparse.Namespace) -> int:
    since = args.since  # epoch seconds: argparse runs _since on the default too
    config, _ = configuration.load(args.config)
    db = config.daemon.state_dir / "gpuwarden.db"
    if not db.exists():  # opening it would make an empty store, and a state_dir where none was meant
        print(f"gpuwarden events: no store at {db}: gpuwarden has not run with this state_dir", file=sys.stderr)
        _emit(args, [], str)
        return EXIT_OK  # no events, as from an empty store
    only = {"until": args.until, "kinds": args.kind or (), "gpus": args.gpu or (), "engines": args.engine or (),
            "severities": SEVERITIES[SEVERITIES.index(args.severity):] if args.severity else ()}
    store = Store(db)
    try:
        rows = store.events(since, args.limit, **only)
        left_out = store.count_events(since, **only) - len(rows) if len(rows) == args.limit else 0
    finally:
        store.close()

    def text(row: dict) -> str:
        stamp = datetime.fromtimestamp(row["time"]).isoformat(sep=" ", timespec="seconds")
        count = f" (x{row['count']})" if row["count"] > 1 else ""
        return f"{stamp}  {row['severity']:<8} {row['kind']:<16} {row['gpu'] or '-':<13} {row['message']}{count}" \
            + _history(row["evidence"])
    if not _emit(args, rows, text) and not (args.json or args.jsonl):
        until = f" until {_stamp(args.until)}" if args.until is not None else ""
        print(f"no events since {_stamp(since)}{until}"
              + (" that match" if args.kind or args.gpu or args.engine or args.severity else ""), file=sys.stderr)
    if left_out:
        print(f"{left_out} older event{'' if left_out == 1 else 's'} left out: the newest {args.limit} are shown "
              "(--limit N for more, or a later --since)", file=sys.stderr)
    return EXIT_OK


def _history(evidence: dict) -> str:
    """An event read at start from a line logged before (its time is the reading's): said, with the line's own
    time where the log told it."""
    if HISTORY not in evidence:
        return ""
    logged = evidence.get(LOGGED_AT)
    return f" [history: logged {_stamp(logged)}]" if logged else " [history: logged before gpuwarden started]"


def _stamp(when: float) -> str:
    return datetime.fromtimestamp(when).isoformat(sep=" ", timespec="seconds")


def cmd_conditions(args: argparse.Namespace) -> int:
    """The open conditions, read-only (the daemon may be running, or stopped: nothing is created)."""
    from gpuwarden.cli.npd import read_conditions

    config, _ = configuration.load(args.config)
    try:
        rows = read_conditions(config.daemon.state_dir / "gpuwarden.db", timeout=2.0)
    except LookupError as exc:
        print(f"gpuwarden conditions: {exc}", file=sys.stderr)
        _emit(args, [], str)  # --json is still one document: no condition
        return EXIT_OK

    def text(row: dict) -> str:
        stamp = datetime.fromtimestamp(row["time"]).isoformat(sep=" ", timespec="seconds")
        return f"since {stamp}  {row['condition']:<19} {row['subject']:<13} by {', '.join(row['causes'])}"
    if not _emit(args, rows, text) and not (args.json or args.jsonl):
        print("no open condition", file=sys.stderr)
    return EXIT_OK


def cmd_npd_check(args: argparse.Namespace) -> int:
    """One line of at most 80 bytes on stdout; the exit status is the verdict (npd.py says which conditions)."""
    from gpuwarden.cli import npd

    def run() -> tuple[int, str]:
        try:
            config, _ = configuration.load(args.config)  # in the bounded thread too: a hung disk is unknown
        except ConfigError as exc:
            return npd.UNKNOWN, f"unknown: configuration error: {str(exc).splitlines()[0]}"
        return npd.check(args.condition, config, args.timeout)

    code, text = npd.bounded(run, args.timeout)
    print(npd.message(text))
    return code


def cmd_replay(args: argparse.Namespace) -> int:
    from gpuwarden.kernel.formats import parse_lines
    from gpuwarden.kernel.watch import classifier_for

    config, _ = configuration.load(args.config)
    malformed, critical = 0, False
    found: list[dict] = []
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            print(f"gpuwarden replay: {name}: {exc.strerror}", file=sys.stderr)
            return EXIT_FAILURE
        parsed = parse_lines(text.splitlines(), pasted=True)  # a saved or pasted log
        malformed += parsed.malformed
        classifier = classifier_for(config.kernel)
        now = time.time()
        bursts = [b for record in parsed.records for b in classifier.feed(record, now)]
        bursts += classifier.flush(now, everything=True).new
        rows = [_replayed(b.final, name) for b in bursts]
        critical = critical or any(r["severity"] == "critical" for r in rows)
        if args.json:
            found += rows  # one document at the end
        else:
            _emit(args, rows, lambda r: f"{r['severity']:<8} {r['kind']:<13} {r['gpu'] or '-':<13} x{r['count']:<4} "
                                        f"{r['message']}")
    if args.json:
        print(json.dumps(found))
    if malformed:
        print(f"gpuwarden replay: {plural(malformed, 'malformed line')} skipped", file=sys.stderr)
    return EXIT_CRITICAL if critical else EXIT_OK


def _replayed(event, source: str) -> dict:
    return {"file": source, "kind": event.kind, "severity": str(event.severity), "gpu": event.gpu,
            "xid": event.evidence.get("xid"), "count": event.count, "line": event.evidence.get("line"),
            "message": event.message}


def cmd_test_alert(args: argparse.Namespace) -> int:
    from gpuwarden.alert.channel import Alert
    from gpuwarden.alert.targets import build

    config, _ = configuration.load(args.config)
    targets = build(config.alerts)
    if not targets:
        print("no alert targets configured ([alerts] urls or [[alerts.target]])", file=sys.stderr)
        return EXIT_FAILURE
    title = f"[TEST] gpuwarden on {config.alerts.hostname}"
    body = "This is a test alert from `gpuwarden test-alert`. If you read this, alerts reach you."
    failed = 0
    for target in targets:
        # as the alerts go: plain where it is plain; to Alertmanager an info alert that its resolve_timeout ends
        alert = Alert(title, body, body.replace("`", ""), "info", False, identities=[{"labels": {
            "alertname": "test_alert", "severity": "info", "host": config.alerts.hostname}, "starts": time.time()}])
        _, error = asyncio.run(target.channel.notify(alert, config.alerts.send_timeout))
        failed += error is not None
        print(f"{target.name}: {'ok' if error is None else error}")
    return EXIT_FAILURE if failed else EXIT_OK


def cmd_probe(args: argparse.Namespace) -> int:
    from gpuwarden.config.settings import check_metrics_url
    from gpuwarden.engine.parts import target_spec
    from gpuwarden.engine.scraper import ScrapeError, Scraper

    engine = configuration.EngineConfig(name="probe", metrics_url=args.url) if args.url else None
    if args.engine:
        config, _ = configuration.load(args.config)
        engine = next((e for e in config.engine if e.name == args.engine), None)
        if engine is None:
            print(f"gpuwarden probe: no [[engine]] named {args.engine!r} in the configuration", file=sys.stderr)
            return EXIT_USAGE
        args.url = args.url or engine.metrics_url
    if engine is None:
        print("gpuwarden probe: give the engine's metrics URL, or --engine NAME", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_metrics_url(args.url)
    except ValueError as exc:
        print(f"gpuwarden probe: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def once():
        scraper = Scraper(args.url, args.profile, timeout=args.timeout)
        try:
            return await scraper.scrape(), None
        except ScrapeError as exc:
            return None, str(exc)
        finally:
            await scraper.close()

    sample, error = asyncio.run(once())
    report = {"url": redact(args.url), "up": sample is not None, "error": error,
              "profile": sample and sample.profile, "running": sample and sample.running,
              "waiting": sample and sample.waiting, "generated_tokens": sample and sample.generated,
              "tokens_processed": sample and sample.progress,
              "progress": sample and ("per step" if sample.per_step else "per finished request"),
              "spec_acceptance": sample and sample.spec_acceptance, "families": sample and list(sample.families)}
    procs, report["processes"], report["refused"] = _resolved(target_spec(engine))
    if args.canary:
        report["canary"], report["canary_detail"] = _probe_canary(engine, procs, sample)
    if sample is None:
        from gpuwarden.engine.discovery import hint
        report["hint"] = hint(args.url)
    if args.json:
        print(json.dumps(report))
    else:
        def show(value):
            if value is None:
                return "unknown"
            if isinstance(value, list):
                return ", ".join(value)
            return f"{value:,.0f}" if isinstance(value, float) and value.is_integer() else str(value)
        for key in ("up", "profile", "running", "waiting", "generated_tokens", "tokens_processed", "progress",
                    "spec_acceptance", "families", "error", "hint", "canary", "canary_detail"):
            if key not in ("error", "hint", "canary", "canary_detail") or report.get(key):
                print(f"{key:<17} {show(report[key])}")
        print(f"# the processes serving {redact(args.url)}, as a {engine.target.kind} target would kill them:")
        _print_processes(report["processes"], report["refused"])
    return EXIT_OK if sample and report.get("canary", "ok") in ("ok", "off") else EXIT_FAILURE


def _probe_canary(engine, procs, sample) -> tuple[str, str]:
    """The daemon's canary, once: its outcome and what it said (a refusal names what to set; never the key)."""
    from gpuwarden.engine.canary import CanaryResult, api_for, canary
    from gpuwarden.engine.parts import base_url
    from gpuwarden.engine.watch import client_of

    if engine.canary == "off":
        return "off", "the canary is off"
    client = client_of(engine, procs)
    if isinstance(client, CanaryResult):
        return client.outcome, client.detail
    api = api_for(engine.canary, sample.profile.split()[0] if sample else engine.profile)
    result = asyncio.run(canary(base_url(engine), api, engine.canary_timeout, client))
    said = f"{result.detail} (sent the API key {client.key_from})" if client.key and result.outcome == "ok" \
        else result.detail
    return result.outcome, said


def cmd_guard(args: argparse.Namespace) -> int:
    from gpuwarden.act.guard import Guard, GuardError, paths_for, release, status
    from gpuwarden.gpu.discovery import discover

    config, _ = configuration.load(args.config)
    sysfs = config.gpu.sysfs_root
    devices = config.guard.devices or [g.pci for g in discover(sysfs)]
    paths = paths_for(devices, sysfs)
    if not paths:
        print("no GPU to guard (none found; set [guard] devices to choose)", file=sys.stderr)
        if args.json:
            print("[]")
        return EXIT_OK if args.action == "status" else EXIT_FAILURE
    try:
        if args.action == "apply":
            Guard.new(sysfs).ensure(paths)
        elif args.action == "release":
            if os.geteuid() != 0:
                raise GuardError("releasing the recovery guard needs root")
            for path, guarded in status(paths, sysfs):
                if guarded:
                    release(path)
    except GuardError as exc:
        print(f"gpuwarden guard {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    rows = status(paths, sysfs)
    if args.json:
        print(json.dumps([{"path": str(p), "intact": ok} for p, ok in rows]))
    else:
        for path, ok in rows:
            print(f"{'intact ' if ok else 'missing'}  {path}")
    return EXIT_OK


def cmd_quarantine(args: argparse.Namespace) -> int:
    """Named directories are moved as asked; with none, the configured caches that hold zero-byte files."""
    from gpuwarden.act.quarantine import Poisoned, cache_dirs, moved_event, scan

    config, _ = configuration.load(args.config)
    if args.dirs:
        found = {p.dir: p for p in scan(args.dirs)}
        poisoned = [found.get(d, Poisoned(d, 0)) for d in args.dirs]
    else:
        poisoned = scan(cache_dirs(config.cache))
    event = moved_event(poisoned, args.reason, time.time(), args.dry_run or config.cache.dry_run)
    if event is None:
        print("no zero-byte file in the compile caches; nothing moved")
        return EXIT_OK
    print(event.message)
    store = Store(config.daemon.state_dir / "gpuwarden.db")
    try:
        store.add_events([event])
    finally:
        store.close()
    return EXIT_FAILURE if event.evidence["failed"] else EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 0 when nothing is wrong, 1 when a finding is at warning or above."""
    from gpuwarden.cli import doctor
    from gpuwarden.core.model import Severity
    from gpuwarden.gpu.discovery import discover
    from gpuwarden.gpu.watch import read_once

    config, _ = configuration.load(args.config)
    facts = doctor.collect(config, read_once(config.gpu, discover(config.gpu.sysfs_root)))
    findings = doctor.diagnose(facts, config.gpu)
    if args.json:
        print(json.dumps([{**dataclasses.asdict(f), "severity": str(f.severity)} for f in findings]))
    else:
        if not facts.gpus:
            print("no GPUs found")
        for f in findings:
            print(f"{str(f.severity).upper():<8} {f.check:<12} {f.subject:<13} {f.what}")
            if f.advice:
                print(f"{'':<35}-> {f.advice}")
        counts = {s: sum(f.severity == s for f in findings) for s in Severity}
        print(f"\n{counts[Severity.CRITICAL]} critical, {plural(counts[Severity.WARNING], 'warning')}, "
              f"{plural(counts[Severity.INFO], 'note')}")
    return EXIT_FAILURE if doctor.worst(findings) >= Severity.WARNING else EXIT_OK


def cmd_incidents(args: argparse.Namespace) -> int:
    from gpuwarden.store.bundles import listing

    config, _ = configuration.load(args.config)
    rows = listing(config.daemon.state_dir / "incidents")

    def text(row: dict) -> str:
        stamp = datetime.fromtimestamp(row["time"]).isoformat(sep=" ", timespec="seconds")
        picture = "timeline.svg" if row["picture"] else "no picture"
        return (f"{stamp}  {row['kind']:<16} {row['subject']:<13} {plural(row['events'], 'event'):>10} "
                f"{plural(row['actions'], 'action'):>10}  {picture:<12}  {row['folder']}"
                + (f"\n    ended: {row['ended']}" if row.get("ended") else ""))
    if not _emit(args, rows, text) and not (args.json or args.jsonl):
        print("no incident reports", file=sys.stderr)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """The daemon's snapshot from its exporter (/status.json); when no daemon answers, one fresh reading of every
    GPU through the same readers as the daemon. --json: {"daemon": snapshot or null, "error": why not,
    "readings": the fresh readings, without a daemon}."""
    from gpuwarden.gpu.discovery import discover
    from gpuwarden.gpu.watch import read_once

    config, _ = configuration.load(args.config)
    snap, error = _daemon_status(config, args.timeout)
    if snap is not None:  # JSON escapes control characters; the text has them escaped
        print(json.dumps({"daemon": snap, "error": None, "readings": None}) if args.json
              else _status_text(_printable(snap)))
        return EXIT_OK
    error = _printable(error)
    print(f"gpuwarden status: no daemon answers ({error}); a fresh reading of the GPUs instead", file=sys.stderr)
    gpus = discover(config.gpu.sysfs_root)
    samples = read_once(config.gpu, gpus)
    if args.json:
        print(json.dumps({"daemon": None, "error": error,
                          "readings": [dataclasses.asdict(s) for s in samples.values()]}, default=str))
        return EXIT_OK
    if not gpus:
        print("no GPUs found")
        return EXIT_OK
    print(f"{'gpu':<13} {'vendor':<6} {'model':<22} {'state':<12} {'power':>8} {'cap':>6} {'temp °C':<22} "
          f"{'fan':>6} {'sclk MHz':>8} {'busy':>5} {'vram used':>10} {'pcie':<12}")
    for gpu in gpus:
        s = samples.get(gpu.pci)
        if s is None:
            print(f"{gpu.pci:<13} {gpu.vendor:<6} {'-':<22} {'no reader' if gpu.driver else 'no driver'}")
            continue
        temps = " ".join(f"{k}={v:.0f}" for k, v in s.temperatures.items()) or "-"
        fan = s.fan_state or (f"{s.fan_rpm:.0f}" if s.fan_rpm is not None else "-")
        print(f"{s.gpu:<13} {s.vendor:<6} {(s.model or '-')[:22]:<22} {s.state:<12} {_w(s.power_watts):>8} "
              f"{_w(s.power_cap_watts):>6} {temps:<22} {fan:>6} "
              f"{(f'{s.sclk_hz / 1e6:.0f}' if s.sclk_hz else '-'):>8} "
              f"{(f'{s.busy_ratio:.0%}' if s.busy_ratio is not None else '-'):>5} "
              f"{(f'{s.vram_used_bytes / 2**30:.1f} GiB' if s.vram_used_bytes is not None else '-'):>10} "
              f"{(f'{s.pcie_speed_gts:g}GT/s x{s.pcie_width}' if s.pcie_speed_gts else '-'):<12}")
    return EXIT_OK


def _w(watts: float | None) -> str:
    return f"{watts:.0f} W" if watts is not None else "-"


def _daemon_status(config: configuration.Config, timeout: float) -> tuple[dict | None, str | None]:
    """The running daemon's snapshot: through its Unix socket in the state directory (exporter.LocalStatus: only
    the daemon's user can make it there), else at the exporter's address once its listener is proved root's or
    ours (/proc/net/tcp). The port is unprivileged: a user who holds it would answer root's `status` as the
    daemon. Never a reading from anyone else."""
    import socket
    import struct

    from gpuwarden.runtime.sockets import peer_uid
    from gpuwarden.web.exporter import STATUS_SOCKET

    trusted = {0, os.geteuid()}
    path = config.daemon.state_dir / STATUS_SOCKET
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except OSError as exc:
        sock.close()
        local = f"{path}: {exc.strerror or exc}"
    else:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid not in trusted:
            sock.close()
            return None, f"{path} is served by uid {uid}, not by root: not read"
        return _ask_status(sock, "localhost", str(path))
    exporter = config.exporter
    if not exporter.enabled:
        return None, f"{local}; the exporter is off ([exporter] enabled = false)"
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(exporter.listen, exporter.listen)
    where = f"{f'[{host}]' if ':' in host else host}:{exporter.port}"
    try:
        sock = socket.create_connection((host, exporter.port), timeout)
    except OSError as exc:
        return None, f"{local}; {where}: {exc.strerror or exc}"
    if (uid := peer_uid(sock)) not in trusted:
        sock.close()
        holder = "cannot be told" if uid is None else f"is uid {uid}"
        return None, f"{local}; the listener on {where} {holder}, not the daemon (root): not read"
    return _ask_status(sock, host, f"http://{where}/status.json")


_MAX_STATUS = 16 << 20  # a snapshot's JSON is tens of KB


def _ask_status(sock, host: str, where: str) -> tuple[dict | None, str | None]:
    """GET /status.json over `sock`, which is connected to a peer proved to be the daemon (its timeout bounds
    each read)."""
    import http.client

    connection = http.client.HTTPConnection(host)
    connection.sock = sock
    try:
        connection.request("GET", "/status.json")
        response = connection.getresponse()
        body = response.read(_MAX_STATUS)
        if response.status == 401:
            return None, f"{where}: the exporter asks for a password; run as root, which reads the daemon's socket"
        if response.status != 200:
            return None, f"{where}: HTTP {response.status}"
        snap = json.loads(body)
        return (snap, None) if isinstance(snap, dict) else (None, f"{where}: not a snapshot")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return None, f"{where}: {exc}"
    finally:
        connection.close()


# C0 (newline included: a line of its own would pass for the daemon's), DEL, C1, and the bidirectional overrides
# that reorder what a line shows
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _printable(value):
    """`value` (a snapshot, a message) with every string's control characters escaped: what the daemon passes on
    is partly users' text (an engine's log, a command line), and an escape sequence printed raw to root's
    terminal can write its clipboard (OSC 52), retitle it or hide lines."""
    if isinstance(value, str):
        return _UNPRINTABLE.sub(lambda m: repr(m[0])[1:-1], value)
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def _status_text(snap: dict) -> str:
    from gpuwarden.web.statuspage import ago

    now = snap["time"]
    lines = [f"gpuwarden {snap['version']} on {snap['host']}, pid {snap['pid']}: {snap['summary']}", "", "sources:"]
    lines += [f"  {s['name']:<10} {_updown(s['up']):<8} {s['detail']}" for s in snap["sources"]]
    lines += ["", "engines:" if snap["engines"] else "engines: none watched"]
    lines += [f"  {e['name']:<16} {e['state']:<13} running {_n(e['running']):>3} waiting {_n(e['waiting']):>3}  "
              f"last progress {ago(e['last_progress'], now)}" for e in snap["engines"]]
    lines += ["", f"open incidents: {len(snap['incidents']) or 'none'}"]
    for i in snap["incidents"]:
        lines.append(f"  {i['id']}  opened {ago(i['opened'], now)}  {i['message']}")
        lines += [f"    decided: {' '.join(filter(None, (d.get('action'), d.get('engine'))))} ({d.get('reason')})"
                  + (" [dry run]" if d.get("dry_run") else "") for d in i["decisions"]]
    lines += ["", "GPUs:" if snap["gpus"] else "GPUs: none found"]
    for g in snap["gpus"]:
        sensors = g["sensors"]
        temps = " ".join(f"{k.split('_')[1]}={v:.0f}" for k, v in sensors.items() if k.startswith("temperature_"))
        power = f"{sensors['power_watts']:.0f} W" if "power_watts" in sensors else "-"
        lines.append(f"  {g['gpu']:<13} {g['vendor']:<6} {(g['model'] or '-')[:22]:<22} {g['state']:<12} {power:>6} "
                     f"{temps}")
    return "\n".join(lines)


def _updown(up: bool | None) -> str:
    return "unknown" if up is None else "up" if up else "DOWN"


def _n(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"
