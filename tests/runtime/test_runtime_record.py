"""runtime/_record.py: the value classes the manifest specs and layouts are made of behave as
frozen dataclasses would (construction, defaults, equality, hashing, immutability)."""

from __future__ import annotations

import copy
import pickle

import pytest

from tilebin.runtime._manifest import BuildInfo, KernelSpec, ParamSpec
from tilebin.runtime._record import Factory, FrozenRecordError, is_record, record, record_fields


@record
class Point:
    x: int
    y: int = 0
    tags: dict = Factory(dict)


def test_construction_by_position_keyword_and_defaults():
    assert Point(1) == Point(x=1) == Point(1, 0) == Point(1, y=0, tags={})
    assert Point(1, 2).y == 2 and Point(y=3, x=1).x == 1
    a, b = Point(1), Point(1)
    assert a.tags == {} and a.tags is not b.tags  # a Factory default is made per instance
    assert "tags" not in Point.__dict__


@pytest.mark.parametrize("call, match", [
    (lambda: Point(), "missing argument 'x'"),
    (lambda: Point(1, 2, {}, 4), "takes 3 arguments, got 4"),
    (lambda: Point(1, x=2), "a second value for argument 'x'"),
    (lambda: Point(1, z=2), "an unexpected argument 'z'"),
])
def test_bad_arguments_are_type_errors(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_frozen_equality_hash_and_repr():
    p = Point(1, 2)
    with pytest.raises(FrozenRecordError, match="frozen"):
        p.x = 5
    with pytest.raises(AttributeError):
        del p.y
    assert p != Point(2, 2) and p != (1, 2, {})
    assert repr(p) == "Point(x=1, y=2, tags={})"
    assert hash(ParamSpec("x", "tensor", 2)) == hash(ParamSpec("x", "tensor", 2))
    assert len({ParamSpec("x", "tensor", 2), ParamSpec("x", "tensor", 2), ParamSpec("y", "scalar")}) == 2
    with pytest.raises(TypeError):
        hash(p)  # a dict field: unhashable, as a frozen dataclass would be


def test_copies_and_pickles_keep_the_value():
    spec = KernelSpec("k", (ParamSpec("x", "tensor", 1),), (), doc="d", meta={"n": 3})
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert copy.deepcopy(spec) == spec and copy.copy(spec) == spec


def test_identity_and_mutable_records():
    @record(eq=False)
    class Handle:
        h: int

    @record(frozen=False)
    class Box:
        v: int

    assert Handle(1) != Handle(1) and hash(Handle(1)) is not None
    b = Box(1)
    b.v = 2
    assert b == Box(2) and Box.__hash__ is None


def test_fields_and_declaration_errors():
    assert record_fields(BuildInfo)[:2] == ("arch", "min_driver_cuda") and is_record(Point(1))
    assert not is_record(object())
    with pytest.raises(TypeError, match="without a default follows"):
        @record
        class Bad:
            a: int = 0
            b: int


@record
class Point3(Point):
    y: int = 5  # a base field re-declared: new default, same position
    z: int = 0


@record(frozen=False, eq=False)
class Counted:
    n: int
    seen: list = Factory(list)

    def __post_init__(self) -> None:
        self.seen.append(self.n)


def test_subclass_fields_follow_the_base_and_post_init_runs():
    assert record_fields(Point3) == ("x", "y", "tags", "z")
    p = Point3(1)
    assert (p.x, p.y, p.tags, p.z) == (1, 5, {}, 0)
    assert Point3(1, 2, {}, 3).z == 3 and Point(1).y == 0  # the base keeps its own default
    assert Point3(1) == Point3(1) and Point3(1) != Point(1, 5)  # equality is per class, as dataclasses
    with pytest.raises(FrozenRecordError):
        p.z = 1
    c = Counted(4)
    assert c.seen == [4] and Counted(4) != c  # identity equality with eq=False


def test_replace_copies_with_changes():
    from tilebin.runtime._record import replace

    p = Point3(1, 2, {"a": 1}, 3)
    q = replace(p, z=4)
    assert (q.x, q.y, q.tags, q.z) == (1, 2, {"a": 1}, 4) and type(q) is Point3 and p.z == 3
    with pytest.raises(TypeError, match="no field 'w'"):
        replace(p, w=1)
