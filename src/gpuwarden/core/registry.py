"""Names the domain defines and the config names: the kernel rules and the runbooks. The domain fills this
when it is imported (kernel/rules.py, alert/runbooks.py), so that config.py checks names against it without
importing a domain package; the entry points (cli.py) import the domain before they load a config.

And the components' registry (gpud's components registry and LastHealthStates): each component that has a state
to show reports it itself (`Reports.state`); the status page and `gpuwarden status` read the registry, never a
component's insides."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

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


class Reports(Protocol):
    """A component's contract with the registry: its state now, as a plain, JSON-ready dict (read on the loop)."""

    def state(self) -> dict[str, Any]: ...


class Registry:
    """The components that report their state, each under its name; one built anew (a restart, a reload) takes
    its name's place."""

    def __init__(self) -> None:
        self._parts: dict[str, Reports] = {}

    def register(self, name: str, part: Reports) -> None:
        self._parts[name] = part

    def states(self) -> dict[str, dict[str, Any]]:
        """Each registered component's state now (gpud's LastHealthStates)."""
        return {name: part.state() for name, part in self._parts.items()}
