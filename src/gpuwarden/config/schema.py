"""A small typed schema for the configuration's tables: each `Section` lists its keys as `field(kind, default)`,
and validating a parsed TOML table gives a read-only instance, or every problem found, each with its key's path
(`("engine", 0, "scrape_timeout")`) so that config.py can name the line. Data-driven and its own: pydantic did
this for 120 ms of import and several MB that `run` carries all its life (issue 27)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]  # (where, what is wrong)
Convert = Callable[[Any], Any]  # a raw value -> the value kept; raises ValueError saying why not

REQUIRED: Any = object()
_INVALID: Any = object()  # a value that failed: its problems are already listed


class Invalid(ValueError):
    """Every problem of one validation: the fields in their order, unknown keys after them."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(f"{'.'.join(map(str, loc))}: {why}" for loc, why in problems))
        self.problems = problems


# --- scalar kinds: functions from the TOML value to the value kept ------------------------------------------------

def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")
    return value


def boolean(value: Any) -> bool:
    """A TOML boolean only. A quoted "yes", "off" or a 1 is text or a number: which of them mean true is a
    guess (is "n" no? "disabled"?), and a guess wrong turns a switch the other way than the file reads."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"Input should be true or false, without quotes (TOML's booleans), not {value!r}")


def integer(ge: int | None = None, le: int | None = None) -> Convert:
    def convert(value: Any) -> int:
        if isinstance(value, str):  # "9000" is 9000, as TOML's 9000 is
            try:
                value = int(value.strip())
            except ValueError:
                raise ValueError("Input should be a valid integer, unable to parse string as an integer") from None
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("Input should be a valid integer" + (", got a number with a fractional part"
                                                                 if isinstance(value, float) else ""))
        _bounds(value, ge, le)
        return value
    return convert


def number(gt: float | None = None) -> Convert:
    def convert(value: Any) -> float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ValueError("Input should be a valid number, unable to parse string as a number") from None
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("Input should be a valid number")
        if not math.isfinite(value):  # TOML has inf and nan: no threshold means either, and nan passes every check
            raise ValueError(f"Input should be a finite number, not {value}")
        if gt is not None and not value > gt:
            raise ValueError(f"Input should be greater than {gt:g}")
        return float(value)
    return convert


def _bounds(value: float, ge: float | None, le: float | None) -> None:
    if ge is not None and value < ge:
        raise ValueError(f"Input should be greater than or equal to {ge}")
    if le is not None and value > le:
        raise ValueError(f"Input should be less than or equal to {le}")


def one_of(*options: str) -> Convert:
    said = ", ".join(map(repr, options[:-1])) + f" or {options[-1]!r}"

    def convert(value: Any) -> str:
        if value not in options or not isinstance(value, str):
            raise ValueError(f"Input should be {said}")
        return value
    return convert


def filepath(value: Any) -> Path:
    if not isinstance(value, str | Path):
        raise ValueError("Input is not a valid path")
    return Path(value)


class Secret:
    """A string that prints as '**********' (apprise URLs carry tokens): only `get_secret_value` shows it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def secret(value: Any) -> Secret:
    return value if isinstance(value, Secret) else Secret(text(value))


def then(convert: Convert, *checks: Convert) -> Convert:
    """`convert`, then each check on its result (a check returns the value, or raises ValueError)."""
    def chained(value: Any) -> Any:
        value = convert(value)
        for check in checks:
            value = check(value)
        return value
    return chained


# --- containers: they name the entry or the key that is wrong -----------------------------------------------------

class ListOf:
    def __init__(self, item: Any) -> None:
        self.item = item

    def validate(self, value: Any, loc: Loc, problems: list[Problem]) -> Any:
        if isinstance(value, dict) and isinstance(self.item, type) and issubclass(self.item, Section):
            name = ".".join(map(str, loc))
            problems.append((loc, f"[{name}] is one table, where [[{name}]] (double brackets: an array of tables, "
                                  f"one [[{name}]] for each) is meant"))
            return _INVALID
        if not isinstance(value, list | tuple):
            problems.append((loc, "Input should be a valid list"))
            return _INVALID
        items = [_validate(self.item, v, (*loc, i), problems) for i, v in enumerate(value)]
        return _INVALID if _INVALID in items else items


class DictOf:
    def __init__(self, key: Convert, value: Any) -> None:
        self.key, self.value = key, value

    def validate(self, value: Any, loc: Loc, problems: list[Problem]) -> Any:
        if not isinstance(value, dict):
            problems.append((loc, "Input should be a valid dictionary"))
            return _INVALID
        out, start = {}, len(problems)
        for k, v in value.items():
            key = _validate(self.key, k, (*loc, k), problems)
            out[key] = _validate(self.value, v, (*loc, k), problems)
        return _INVALID if len(problems) > start else out


# --- tables ---------------------------------------------------------------------------------------------------------

class Field:
    __slots__ = ("checks", "default", "factory", "kind", "shown")

    def __init__(self, kind: Any, default: Any, factory: Callable[[], Any] | None, checks: tuple[Convert, ...],
                 shown: Callable[[Any], Any] | None) -> None:
        self.kind, self.default, self.factory, self.checks, self.shown = kind, default, factory, checks, shown

    @property
    def table(self) -> type[Section] | None:
        """The Section this key holds (a table, or an array of tables), if any."""
        kind = self.kind.item if isinstance(self.kind, ListOf) else self.kind
        return kind if isinstance(kind, type) and issubclass(kind, Section) else None

    def fresh(self) -> Any:
        """The default, a new one each time: a list default is never shared between two configurations."""
        if self.factory is not None:
            return self.factory()
        return type(self.default)(self.default) if isinstance(self.default, list | dict) else self.default


def field(kind: Any, default: Any = REQUIRED, *, factory: Callable[[], Any] | None = None, check: Convert = (),
          shown: Callable[[Any], Any] | None = None) -> Any:
    """One key: `kind` is a scalar kind (a function), ListOf, DictOf or a Section; `check`, one function or a
    tuple of them, sees the whole value once its kind took it (`None` passes when the default is None); `shown`
    is what `dump` prints of it."""
    return Field(kind, default, factory, check if isinstance(check, tuple) else (check,), shown)


def _validate(kind: Any, value: Any, loc: Loc, problems: list[Problem]) -> Any:
    if isinstance(kind, type) and issubclass(kind, Section):
        return kind._from(value, loc, problems)
    if isinstance(kind, ListOf | DictOf):
        return kind.validate(value, loc, problems)
    try:
        return kind(value)
    except ValueError as exc:
        problems.append((loc, str(exc)))
        return _INVALID


class Section:
    """A table of the configuration: read-only, compared by value. Subclasses declare their keys with `field`;
    `prepare` (before: the raw table) and `verify` (after: every key valid) check what spans several keys."""

    fields: ClassVar[dict[str, Field]] = {}
    fields_set: frozenset[str]  # the keys the table gave (the others are defaults)

    def __init_subclass__(cls) -> None:
        cls.fields = {name: value for name, value in vars(cls).items() if isinstance(value, Field)}
        for name in cls.fields:
            delattr(cls, name)

    def __init__(self, **values: Any) -> None:
        problems: list[Problem] = []
        self._fill(values, (), problems)
        if problems:
            raise Invalid(problems)

    @classmethod
    def validate(cls, data: Any) -> Any:
        """`data` as this table, or Invalid with every problem."""
        problems: list[Problem] = []
        made = cls._from(data, (), problems)
        if problems:
            raise Invalid(problems)
        return made

    @classmethod
    def _from(cls, data: Any, loc: Loc, problems: list[Problem]) -> Any:
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            problems.append((loc, f"Input should be a valid dictionary or instance of {cls.__name__}"))
            return _INVALID
        made = object.__new__(cls)
        return made if made._fill(data, loc, problems) else _INVALID

    def _fill(self, data: dict[str, Any], loc: Loc, problems: list[Problem]) -> bool:
        start = len(problems)
        try:
            data = self.prepare(data)
        except ValueError as exc:
            problems.append((loc, str(exc)))
            return False
        values = {}
        for name, f in self.fields.items():
            if name not in data:
                if f.default is REQUIRED and f.factory is None:
                    problems.append(((*loc, name), "required key is missing"))
                values[name] = f.fresh()
            elif (value := data[name]) is None and f.default is None:
                values[name] = None
            elif (value := _validate(f.kind, value, (*loc, name), problems)) is not _INVALID:
                values[name] = _checked(f.checks, value, (*loc, name), problems)
        for key in data:
            if key not in self.fields:
                fix = hint(str(key), self.fields) or _known(loc, self.fields)
                problems.append(((*loc, key), "unknown key" + fix))
        if len(problems) > start:
            return False
        self.__dict__.update(values, fields_set=frozenset(k for k in data if k in self.fields))
        try:
            self.verify()
        except ValueError as exc:
            problems.append((loc, str(exc)))
            return False
        return True

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        return data

    def verify(self) -> None:
        pass

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only: a new configuration is a new instance")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self.fields)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in self.fields))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.fields)})"

    def dump(self) -> dict[str, Any]:
        """Plain data for JSON: paths as text, secrets as '**********', each key as its field shows it."""
        out = {}
        for name, f in self.fields.items():
            value = getattr(self, name)
            out[name] = _plain(f.shown(value) if f.shown else value)
        return out


def _checked(checks: tuple[Convert, ...], value: Any, loc: Loc, problems: list[Problem]) -> Any:
    try:
        for check in checks:
            value = check(value)
    except ValueError as exc:
        problems.append((loc, str(exc)))
        return _INVALID
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.dump()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Secret):
        return "**********"
    return str(value) if isinstance(value, Path) else value


def _known(loc: Loc, fields: Iterable[str]) -> str:
    """The fix for a key no close name explains: the keys the table has."""
    table = ".".join(str(p) for p in loc if not isinstance(p, int))
    shown = f"[[{table}]]" if loc and isinstance(loc[-1], int) else f"[{table}]" if table else "the file"
    return f": {shown} takes {', '.join(fields)}"


def hint(name: str, known: Iterable[str]) -> str:
    """' (did you mean "x"?)' for the closest of `known`, or nothing."""
    import difflib  # only on the way to an error

    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
