"""`@plain`: how gpuwarden declares an immutable record that nothing compares, hashes or prints. A frozen dataclass
with slots, and of the methods a dataclass generates only `__init__` and the frozen guard: Python 3.11 compiles each
generated method from source at import (about 0.1 ms each), and `__eq__`, `__hash__` and `__repr__` of the records
`run` loads were 15 ms of every start. Equality and hashing are an object's own (identity): a record that is compared
by value or kept in a set (a condition's key, a policy's action that tests compare) stays a full dataclass."""

from dataclasses import dataclass

plain = dataclass(frozen=True, slots=True, eq=False, repr=False)
