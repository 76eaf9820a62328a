"""The one error hierarchy of tilebin.  Every message says what failed, the value, and the fix."""

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


class ArtifactError(TilebinError):
    """The manifest or a cubin is missing, unreadable, of another schema, or fails its checksum."""


class DeviceError(TilebinError, RuntimeError):
    """No usable GPU/driver, the wrong architecture, a driver too old, or a driver call failed."""
