"""A count as a person writes it, for every message gpuwarden makes (an event's, a page's): `1 process`,
`2 processes`, `1,250 tokens`, never `(s)` nor `2.0`."""


def plural(n: float, word: str, many: str | None = None) -> str:
    """`1 process`, `2 processes`, `1,250 tokens`; `many` where adding -s or -es is wrong (`try`, `tries`)."""
    n = round(n)
    return f"{n:,} {word if n == 1 else many or _plural(word)}"


def _plural(word: str) -> str:
    return word + ("es" if word.endswith(("s", "x", "ch", "sh")) else "s")
