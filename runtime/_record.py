"""Value classes for the runtime's specs and layouts, without ``dataclasses``' import-time cost.

``@record`` turns a class whose annotated attributes are its fields into what
``@dataclass(frozen=True)`` would make of it: ``__init__`` (positional or keyword, defaults,
``Factory`` defaults made per instance), ``__repr__``, ``__eq__`` (same class, fields in order)
and ``__hash__`` (of the fields), and assignment refused with :class:`FrozenRecordError`.
``eq=False`` keeps identity equality and hashing; ``frozen=False`` allows assignment (and, with
``eq``, makes instances unhashable, as dataclasses do).

Why: ``dataclasses`` generates each class's methods with several ``exec`` calls and inspects
every annotation; the ~20 spec classes imported before an op's first launch cost more than half
of ``import tilebin.ops.quant`` (issue 10's cold-start budget).  Here the methods are closures
over the field names: no code generation, no ``exec``.
"""

from __future__ import annotations

from typing import Any, Callable

_MISSING = object()


class FrozenRecordError(AttributeError):
    """Assignment to a field of a frozen record."""


class Factory:
    """A field default made per instance: ``meta: dict = Factory(dict)``."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenRecordError(f"cannot assign to field {name!r} of {type(self).__name__}: it is frozen")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenRecordError(f"cannot delete field {name!r} of {type(self).__name__}: it is frozen")


def record_fields(obj: Any) -> tuple[str, ...]:
    """The field names of a record class or instance, in order."""
    return (obj if isinstance(obj, type) else type(obj)).__record_fields__


def is_record(obj: Any) -> bool:
    """Whether ``obj`` is an instance of a ``@record`` class."""
    return hasattr(type(obj), "__record_fields__")


def _init(names: tuple[str, ...], defaults: dict[str, Any], frozen: bool) -> Callable[..., None]:
    """The class's ``__init__``: arguments bound to fields by position or name, defaults filled."""
    index = {n: i for i, n in enumerate(names)}
    fill = tuple(defaults.get(n, _MISSING) for n in names)
    put = object.__setattr__ if frozen else setattr

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}() takes {len(names)} arguments, got {len(args)}")
        values = list(args) + [_MISSING] * (len(names) - len(args))
        for key, value in kwargs.items():
            i = index.get(key)
            if i is None or values[i] is not _MISSING:
                why = "an unexpected" if i is None else "a second value for"
                raise TypeError(f"{type(self).__name__}() got {why} argument {key!r}")
            values[i] = value
        for i, value in enumerate(values):
            if value is _MISSING:
                d = fill[i]
                if d is _MISSING:
                    raise TypeError(f"{type(self).__name__}() missing argument {names[i]!r}")
                value = d.make() if isinstance(d, Factory) else d
            put(self, names[i], value)

    return __init__


def _methods(names: tuple[str, ...]) -> dict[str, Callable]:
    """``__repr__``, ``__eq__`` and ``__hash__`` over the fields, in order."""

    def values(obj: Any) -> tuple:
        return tuple([getattr(obj, n) for n in names])

    def __repr__(self: Any) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    def __eq__(self: Any, other: Any) -> Any:
        return values(self) == values(other) if other.__class__ is self.__class__ else NotImplemented

    def __hash__(self: Any) -> int:
        return hash(values(self))

    return {"__repr__": __repr__, "__eq__": __eq__, "__hash__": __hash__}


def record(cls: type | None = None, /, *, frozen: bool = True, eq: bool = True) -> Any:
    """Make ``cls`` a value class (see the module docstring); usable bare or with arguments."""

    def wrap(cls: type) -> type:
        names = tuple(cls.__dict__.get("__annotations__", {}))
        defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
        if any(n in defaults and m not in defaults for n, m in zip(names, names[1:])):
            raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")
        methods = {"__init__": _init(names, defaults, frozen), **_methods(names)}
        if not eq:
            del methods["__eq__"], methods["__hash__"]
        elif not frozen:
            methods["__hash__"] = None
        for name, fn in methods.items():
            if fn is not None:
                fn.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, fn)
        for n, d in defaults.items():
            if isinstance(d, Factory):
                delattr(cls, n)
        if frozen:
            cls.__setattr__, cls.__delattr__ = _frozen_setattr, _frozen_delattr
        cls.__record_fields__ = names
        return cls

    return wrap if cls is None else wrap(cls)


__all__ = ["Factory", "FrozenRecordError", "is_record", "record", "record_fields"]
