"""`@plain`: how gpuwarden declares an immutable record that nothing compares, hashes or prints. A dataclass with
slots (its fields, `dataclasses.fields`, `replace` and `asdict` work as ever), an `__init__`, and the frozen guard.
Python 3.11 compiles each method a dataclass generates from source at import (0.1 to 0.15 ms each): `__eq__`,
`__hash__` and `__repr__` of the records `run` loads were 15 ms of every start, and the frozen guard's
`__setattr__` and `__delattr__`, one pair per class, another 10 ms. So only `__init__` is compiled here; the guard is
one pair shared by every record (no record subclasses another, so it refuses every assignment as the generated one
did). Equality and hashing are an object's own (identity). A record that is compared by value or kept in a set (a
condition's key, an event, a policy's action that tests compare) is `@compared`: the same, with the `__eq__`,
`__hash__` and `__repr__` (and, asked for, the ordering) a frozen dataclass generates."""

from dataclasses import MISSING, FrozenInstanceError, dataclass, fields

_FACTORY = object()  # an argument left out whose field has a default_factory


def plain(cls: type) -> type:
    return _record(cls, repr=False, eq=False)


def compared(cls: type | None = None, /, *, order: bool = False):
    if cls is None:
        return lambda cls: compared(cls, order=order)
    # unsafe_hash: the __hash__ of a frozen dataclass (over the compared fields), which one not frozen leaves out
    return _record(cls, unsafe_hash=True, order=order)


def _record(cls: type, **generated) -> type:
    if hasattr(cls, "__post_init__"):  # the __init__ below never calls it
        raise TypeError(f"{cls.__name__}: a @plain record has no __post_init__")
    cls = dataclass(cls, init=False, slots=True, **generated)
    params, body, names = [], [], {"_set": object.__setattr__, "_FACTORY": _FACTORY}
    for f in fields(cls):
        if not f.init or f.kw_only or f.name in ("self", "_set", "_FACTORY"):
            raise TypeError(f"{cls.__name__}.{f.name}: a @plain record's fields are positional arguments of __init__")
        if f.default is not MISSING:
            names[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        elif f.default_factory is not MISSING:
            names[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f" if {f.name} is _FACTORY: {f.name} = _f_{f.name}()")
        elif params and "=" in params[-1]:
            raise TypeError(f"{cls.__name__}.{f.name}: a field without a default after one with a default")
        else:
            params.append(f.name)
        body.append(f" _set(self, {f.name!r}, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or [" pass"]), names)
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__, cls.__setattr__, cls.__delattr__ = init, _refuse_assignment, _refuse_deletion
    cls.__getstate__, cls.__setstate__ = _state, _set_state  # pickle and copy, past the guard
    return cls


def _refuse_assignment(self, name, value):
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _refuse_deletion(self, name):
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _state(self) -> list:
    return [getattr(self, name) for name in self.__slots__]


def _set_state(self, state: list) -> None:
    for name, value in zip(self.__slots__, state, strict=True):
        object.__setattr__(self, name, value)
