"""The literal hints of a regular expression: strings of which every match contains at least one.

The classifier's Aho-Corasick gate looks for these before it runs any expression, so a hint missing from a
match would silently skip the rule: they are derived from the pattern's syntax tree, never written by hand.
The derivation is exact where it claims anything and gives up (`()`: try every line) where it cannot tell:
case-insensitive parts, classes of more than a few characters, optional or unbounded pieces.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import product

# re's own parser (the stdlib module behind re.compile); the only way to walk a pattern's syntax tree
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

_MAX_SET = 16  # alternatives kept for one piece before it counts as "anything"
_MAX_CLASS = 4  # a [...] class of at most this many characters is expanded
_ZERO_WIDTH = (sre.AT, sre.ASSERT, sre.ASSERT_NOT)

# (exact, required): `exact` is every string the piece can match when that set is small, else None;
# `required` is a set of which every match contains one member, or None when nothing is required.
_Facts = tuple[frozenset[str] | None, frozenset[str] | None]


@lru_cache(maxsize=512)
def hints(pattern: str) -> tuple[str, ...]:
    """Sorted literals of which every match of `pattern` contains one; () when no such set is known."""
    tree = sre_parse.parse(pattern)
    if tree.state.flags & sre.SRE_FLAG_IGNORECASE:
        return ()
    _, required = _sequence(list(tree))
    if not required:
        return ()
    # a literal that contains another is redundant: the shorter one is in the text whenever the longer is
    return tuple(sorted(h for h in required if not any(o != h and o in h for o in required)))


def _sequence(items: list) -> _Facts:
    run: frozenset[str] | None = frozenset({""})  # exact strings of the pieces since the last break
    whole: frozenset[str] | None = run  # exact strings of the whole sequence while it stays exact
    candidates: list[frozenset[str]] = []
    for op, arg in items:
        exact, required = _piece(op, arg)
        if exact is not None and run is not None and len(run) * len(exact) <= _MAX_SET:
            run = frozenset(a + b for a, b in product(run, exact))
            continue
        if run and "" not in run:
            candidates.append(run)
        if required:
            candidates.append(required)
        run, whole = (exact if exact is not None and len(exact) <= _MAX_SET else frozenset({""})), None
    if whole is not None:
        whole = run
    if run and "" not in run:
        candidates.append(run)
    return whole, max(candidates, key=_selectivity, default=None)


def _selectivity(literals: frozenset[str]) -> tuple[float, int, int]:
    """How rarely a line holds one of `literals`, roughly: each character makes a literal rarer (up to 16),
    each doubling of the alternatives makes the set as common as two characters fewer would."""
    shortest = min(map(len, literals))
    return min(shortest, 16) - 2 * math.log2(len(literals)), -len(literals), shortest


def _piece(op, arg) -> _Facts:
    if op is sre.LITERAL:
        return frozenset({chr(arg)}), frozenset({chr(arg)})
    if op in _ZERO_WIDTH:
        return frozenset({""}), None  # consumes nothing: the literals on either side stay adjacent
    if op is sre.IN:
        chars = _class(arg)
        return (chars, chars) if chars else (None, None)
    if op is sre.SUBPATTERN:
        _group, add_flags, _del_flags, body = arg
        if add_flags & sre.SRE_FLAG_IGNORECASE:
            return None, None
        return _sequence(list(body))
    if op is sre.BRANCH:
        facts = [_sequence(list(branch)) for branch in arg[1]]
        exact = None if any(e is None for e, _ in facts) else frozenset().union(*(e for e, _ in facts))
        if exact is not None and len(exact) > _MAX_SET:
            exact = None
        required = None if any(not r for _, r in facts) else frozenset().union(*(r for _, r in facts))
        return exact, required
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
        low, high, body = arg
        exact, required = _sequence(list(body))
        if low == 0:
            return (exact | {""} if exact is not None and high == 1 else None), None
        return None, required
    return None, None  # any character, categories, back-references: nothing known


def _class(items) -> frozenset[str] | None:
    """The characters of a small positive [...] class of plain characters, else None."""
    chars: set[str] = set()
    for op, arg in items:
        if op is sre.LITERAL:
            chars.add(chr(arg))
        elif op is sre.RANGE and arg[1] - arg[0] < _MAX_CLASS:
            chars.update(map(chr, range(arg[0], arg[1] + 1)))
        else:
            return None  # a negation, a category (\d, \w) or a wide range
    return frozenset(chars) if len(chars) <= _MAX_CLASS else None
