"""Names the domain defines and the config names: the kernel rules and the runbooks. The domain fills this
when it is imported (kernel/rules.py, alert/runbooks.py), so that config.py checks names against it without
importing a domain package; the entry points (cli.py) import the domain before they load a config."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_RULES: dict[str, Any] = {}  # name -> the rule (its `kind` and `quiet` are what config asks about)
_RUNBOOKS: set[str] = set()


def register_rules(rules: Iterable[Any]) -> None:
    _RULES.update((rule.name, rule) for rule in rules)


def register_runbooks(names: Iterable[str]) -> None:
    _RUNBOOKS.update(names)


def rules() -> Mapping[str, Any]:
    if not _RULES:  # a config checked against no rule would refuse every rule name: say why instead
        raise RuntimeError("no kernel rule registered: import gpuwarden.kernel.rules before validating a config")
    return _RULES


def runbooks() -> set[str]:
    if not _RUNBOOKS:
        raise RuntimeError("no runbook registered: import gpuwarden.alert.runbooks before validating a config")
    return _RUNBOOKS
