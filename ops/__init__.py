"""Typed op layer: ``tilebin.ops.<module>`` mirrors ``tile_kernels.<module>`` (same names,
signatures and output layouts), so switching is an import change.

Each op validates every argument (typed :class:`tilebin.runtime.ArgumentError` naming the op,
the value and what is supported) before any GPU work, allocates its outputs with torch and
launches prebuilt kernels on torch's current stream.  Needs torch with CUDA.
"""
