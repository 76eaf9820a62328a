"""Value classes for the runtime's specs and layouts, without ``dataclasses``' import-time cost.

``@record`` turns a class whose annotated attributes are its fields into what
``@dataclass(frozen=True)`` would make of it: ``__init__`` (positional or keyword, defaults,
``Factory`` defaults made per instance), ``__repr__``, ``__eq__`` (same class, fields in order)
and ``__hash__`` (of the fields), and assignment refused with :class:`FrozenRecordError`.
``eq=False`` keeps identity equality and hashing; ``frozen=False`` allows assignment (and, with
``eq``, makes instances unhashable, as dataclasses do).  As with dataclasses, a ``@record``
subclass of a record has its base's fields first, then its own; re-annotating a base field gives
it a new default in place; a ``__post_init__`` method runs after ``__init__`` has set the fields.

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


def replace(obj: Any, **changes: Any) -> Any:
    """A copy of record ``obj`` with ``changes`` to its fields (``dataclasses.replace``)."""
    unknown = set(changes) - set(record_fields(obj))
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    return type(obj)(**{n: changes.get(n, getattr(obj, n)) for n in record_fields(obj)})


def _init(cls: type, names: tuple[str, ...], defaults: dict[str, Any], frozen: bool) -> Callable[..., None]:
    """The class's ``__init__``: arguments bound to fields by position or name, defaults filled."""
    index = {n: i for i, n in enumerate(names)}
    fill = tuple(defaults.get(n, _MISSING) for n in names)
    put = object.__setattr__ if frozen else setattr
    post = getattr(cls, "__post_init__", None)

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
        if post is not None:
            post(self)

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
        base = next((b for b in cls.__mro__[1:] if "__record_fields__" in b.__dict__), None)
        own = tuple(cls.__dict__.get("__annotations__", {}))
        names = (() if base is None else base.__record_fields__)
        names += tuple(n for n in own if n not in names)
        defaults = {} if base is None else dict(base.__record_defaults__)
        defaults.update({n: cls.__dict__[n] for n in own if n in cls.__dict__})
        if any(n in defaults and m not in defaults for n, m in zip(names, names[1:])):
            raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")
        methods = {"__init__": _init(cls, names, defaults, frozen), **_methods(names)}
        if not eq:
            del methods["__eq__"], methods["__hash__"]
        elif not frozen:
            methods["__hash__"] = None
        for name, fn in methods.items():
            if fn is not None:
                fn.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, fn)
        for n in own:
            if isinstance(cls.__dict__.get(n), Factory):
                delattr(cls, n)
        if frozen:
            cls.__setattr__, cls.__delattr__ = _frozen_setattr, _frozen_delattr
        cls.__record_fields__, cls.__record_defaults__ = names, defaults
        return cls

    return wrap if cls is None else wrap(cls)


__all__ = ["Factory", "FrozenRecordError", "is_record", "record", "record_fields", "replace"]
