"""The per-element arithmetic of the mHC Sinkhorn forward, shared by ``mhc.sinkhorn_fwd`` /
``mhc.sinkhorn_bwd`` (``sinkhorn.py``) and ``mhc.pre_big_fuse`` (``pre_big_fuse.py``).

The big fuse must reproduce ``mhc.sinkhorn_fwd`` bit for bit, so both kernels build every
floating-point operation of the forward from the expression builders below (plain functions
returning a ``PrimExpr``; no macros, see kernels/README.md).  Each one is an explicit IEEE
round-to-nearest intrinsic (``__fadd_rn``, ``__fsub_rn``, ``__fmul_rn``, ``__fdiv_rn``,
``__frcp_rn``): nvcc never contracts them into FMAs, so two kernels that call them in the same
order get the same bits whatever the surrounding code lets the optimiser do.  ``exp`` is
``expf`` (no fast math in either build), the row max is ``fmaxf``.

The loop order stays in each kernel (it is two short loops per step); it must be the same:
row max in index order, ``e = exp(x - max)``, row sums of ``e`` in index order,
``P = e / sum + eps``, then per step the sums along the axis in index order,
``q = 1 / (sum + eps)`` and ``P = P * q``.  ``tests/mhc_ref/sinkhorn.py``'s
``sinkhorn_fwd_emulated`` is the same algorithm in fp32 torch.
"""

import tilelang.language as T


def add(a, b):
    """``a + b``, rounded on its own (a running sum's step)."""
    return T.ieee_add(a, b)


def shifted_exp(x, row_max):
    """``exp(x - row_max)``: the softmax numerator."""
    return T.exp(T.ieee_sub(x, row_max))


def softmax_plus_eps(e, row_sum, eps):
    """``e / row_sum + eps``: the softmax, then the Sinkhorn ``eps``."""
    return T.ieee_add(T.ieee_fdiv(e, row_sum), eps)


def inv_sum(total, eps):
    """``1 / (total + eps)``: a step's one reciprocal per row or column."""
    return T.ieee_frcp(T.ieee_add(total, eps))


def scaled(p, inv):
    """``p * inv``: an element after a normalisation step."""
    return T.ieee_mul(p, inv)


__all__ = ["add", "inv_sum", "scaled", "shifted_exp", "softmax_plus_eps"]
