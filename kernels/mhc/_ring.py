"""The cp.async copy of the mHC streaming kernels' shared-memory rings (``post.py``,
``pre_apply_mix.py``, ``multilayer_recompute.py``): each thread copies its own 16-byte vectors
of an item into a ring slot and later reads only those bytes, so ``cp.async.wait_group`` is the
only wait.  Declares no kernels (a ``_`` module: ``kernels/modules.py`` skips it)."""

# No ``from __future__ import annotations``: TileLang evaluates the kernels' annotations.
import tilelang.language as T


def cp_async(dst, src, n, pred):
    """One 16-byte ``cp.async`` of ``n`` elements into shared memory, zero-filling when ``pred`` is false."""
    return T.ptx_cp_async(T.access_ptr(dst, "w", n), T.access_ptr(src, "r", n), n, pred)


__all__ = ["cp_async"]
