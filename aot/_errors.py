"""Build-time errors: each names the kernel and variant it concerns."""

from __future__ import annotations


class AotError(Exception):
    """The AOT build cannot produce a correct artifact; the message says why and what to change."""
