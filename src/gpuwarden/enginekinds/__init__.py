"""The engine kinds gpuwarden knows, registered in one place: every list of kinds (the config's `profile` and
`canary` values, `probe --profile`, discovery's command lines, the kill target's executables, the log and
/metrics profiles tried by `auto`) is read from here when it is used. Adding a kind is one module holding its
`EngineKind` (base.py says what each field means) and one line below (docs/engines.md, "Adding an engine kind").
"""

from __future__ import annotations

from gpuwarden.enginekinds import llamacpp, ollama, sglang, tgi, vllm
from gpuwarden.enginekinds.base import CanaryApi, EngineKind

_KINDS: dict[str, EngineKind] = {}


def register(kind: EngineKind) -> EngineKind:
    if kind.name in _KINDS or kind.name in ("auto", "off"):
        raise ValueError(f"engine kind {kind.name!r} is registered already (or a reserved word)")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """For a test's own kind: the built-in ones stay."""
    del _KINDS[name]


def all_kinds() -> tuple[EngineKind, ...]:
    return tuple(_KINDS.values())


def named(name: str) -> EngineKind | None:
    return _KINDS.get(name)


def names() -> tuple[str, ...]:
    return tuple(_KINDS)


def canary_apis() -> dict[str, CanaryApi]:
    """Each API by its name: several kinds may speak one (vLLM and TGI speak OpenAI's)."""
    return {k.canary.name: k.canary for k in _KINDS.values()}


for _module in (vllm, sglang, llamacpp, tgi, ollama):
    register(_module.KIND)
