"""`@plain` records (core/plain.py): immutable, slotted dataclasses whose only compiled method is `__init__`."""

import copy
import dataclasses
import pickle

import pytest

from gpuwarden.core.model import GpuSample
from gpuwarden.core.plain import plain
from gpuwarden.gpu.discovery import Gpu


@plain
class Record:
    """A record with each kind of field a @plain record may have."""

    name: str
    count: int = 0
    labels: dict = dataclasses.field(default_factory=dict)


def test_the_records_share_one_frozen_guard_and_compile_only_their_init():
    """A frozen dataclass compiles its own __setattr__ and __delattr__ from source: 0.3 ms a class, 10 ms of each
    start over the records `run` loads. The records share one pair."""
    assert Gpu.__setattr__ is GpuSample.__setattr__ is Record.__setattr__
    assert Gpu.__delattr__ is GpuSample.__delattr__ is Record.__delattr__
    assert Gpu.__init__ is not Record.__init__ and Record.__init__.__qualname__ == "Record.__init__"


def test_a_record_is_built_like_a_dataclass_and_cannot_be_changed():
    r = Record("a", 2)
    assert (r.name, r.count, r.labels) == ("a", 2, {})
    assert Record("b").labels is not Record("c").labels  # a fresh default each time
    assert Record(name="d", labels={"k": "v"}).labels == {"k": "v"}
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'count'"):
        r.count = 3
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'name'"):
        del r.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.other = 1
    assert not hasattr(r, "__dict__")
    with pytest.raises(TypeError):
        Record()  # a field without a default is a required argument
    with pytest.raises(TypeError):
        Record("a", 1, {}, 4)


def test_fields_replace_asdict_copy_and_pickle_work_past_the_guard():
    r = Record("a", 2, {"k": "v"})
    assert [f.name for f in dataclasses.fields(Record)] == ["name", "count", "labels"]
    assert dataclasses.replace(r, count=5).count == 5 and r.count == 2
    assert dataclasses.asdict(r) == {"name": "a", "count": 2, "labels": {"k": "v"}}
    for twin in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert dataclasses.asdict(twin) == dataclasses.asdict(r) and twin is not r
    gpu = Gpu("ffff:fe:1f.7", "0x1002", "amdgpu")
    assert dataclasses.asdict(pickle.loads(pickle.dumps(gpu))) == dataclasses.asdict(gpu)


def test_a_field_plain_cannot_build_is_refused_at_the_class():
    with pytest.raises(TypeError, match="without a default after one with a default"):
        @plain
        class Late:
            """."""
            a: int = 0
            b: int
    with pytest.raises(TypeError, match="positional arguments"):
        @plain
        class Hidden:
            """."""
            a: int = dataclasses.field(default=0, init=False)
