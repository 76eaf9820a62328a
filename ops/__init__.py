"""Typed op layer: ``tilebin.ops.<module>`` mirrors ``tile_kernels.<module>`` (same names,
signatures and output layouts), so switching is an import change.

Each op validates every argument (typed :class:`tilebin.runtime.ArgumentError` naming the op,
the value and what is supported) before any GPU work, allocates its outputs with torch and
launches prebuilt kernels on torch's current stream.  Needs torch with CUDA.

Every op is also the ``torch.library`` custom op ``tilebin::<op>``: under ``torch.compile`` and
``torch.export`` it is recorded as one graph node with fake-tensor shapes (``ops/_torch.py``);
eager calls never pay for the custom-op dispatch.  A process that loads an exported program
calls :func:`tilebin.ops.register_torch_ops` first.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised by tests/ops/test_ops_imports.py in a subprocess
    raise ImportError('tilebin.ops needs torch; install it with: pip install "tilebin[torch]" '
                      "(the runtime alone, tilebin.runtime, does not)") from _exc


def register_torch_ops() -> None:
    """Register every op as ``tilebin::<op>`` now (tracing does it on first use; loading an
    exported program in a fresh process needs it first).  Idempotent and thread-safe."""
    from ._torch import register_all

    register_all()


__all__ = ["register_torch_ops"]
