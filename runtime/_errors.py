"""The one error hierarchy of tilebin.  Every message says what failed, the value, and the fix.

Every class reports ``__module__ == "tilebin.runtime"`` (its public home), so tracebacks and
reprs show ``tilebin.runtime.ArgumentError``, not this private module.
"""

from __future__ import annotations


class TilebinError(Exception):
    """Base class of every error tilebin raises on purpose."""


class ArgumentError(TilebinError, ValueError):
    """An argument is wrong for the kernel: dtype, rank, shape, strides, alignment, device, aliasing."""


class NoVariantError(ArgumentError, LookupError):
    """No prebuilt variant (or no kernel) matches what the call asked for.

    A subclass of :class:`ArgumentError` too: the one rule is that every refusal of a call's
    arguments (a dtype or static size this wheel has no variant for included) is an
    ``ArgumentError``; catch ``NoVariantError`` to tell "not built" from "wrong".
    """


class UnknownKernelError(NoVariantError):
    """No kernel of that name is in the artifacts (a typo, or a kernel this wheel does not ship).

    A subclass of :class:`NoVariantError` (so ``except NoVariantError`` still catches it).
    ``name`` is the name asked for, ``close`` the nearest known names (may be empty).
    """

    def __init__(self, message: str, name: str = "", close: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.name, self.close = name, tuple(close)


class ArtifactError(TilebinError):
    """The manifest or a cubin is missing, unreadable, of another schema, or fails its checksum."""


class DeviceError(TilebinError, RuntimeError):
    """No usable GPU/driver, the wrong architecture, a driver too old, or a driver call failed."""


PUBLIC = (TilebinError, ArgumentError, NoVariantError, UnknownKernelError, ArtifactError, DeviceError)
for _cls in PUBLIC:
    _cls.__module__ = "tilebin.runtime"
del _cls
