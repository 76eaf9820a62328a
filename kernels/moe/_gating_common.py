"""Building blocks shared by the MoE gating kernels (topk_gate, top2_sum_gate, topk_sum_and_topk_group_idx).

Ordering.  Every selection ranks float32 values the way ``torch.sort(descending=True,
stable=True)`` does, which is what tile_kernels' torch references use: larger first, equal
values by lower index, ``-0.0`` equal to ``+0.0``, NaN above everything (NaNs equal to each
other).  Floats are turned into int32 *keys* that order exactly like that (:func:`order_key`),
so a selection step is two one-instruction warp reductions (``redux.sync``: max of the key,
then min of the expert index among the lanes holding that key) and ties need no extra work.
``KEY_GONE`` (``INT32_MIN``) is below every key a float can produce: it marks experts already
taken and padding slots past the expert count.

Layout.  One warp per token.  A lane owns ``slots`` experts ``e = j * 32 + lane`` for
``j < slots`` (so loads of a row are coalesced) and keeps their keys in registers;
``slots`` is the only compile-time value of the selecting kernels (experts <= 32 * slots).

No ``from __future__ import annotations``: TileLang evaluates annotations.
"""

import tilelang.language as T

KEY_GONE = -(2**31)
KEY_NAN = 2**31 - 1
KEY_NEG_INF = -0x7F800000  # order_key(-inf)
INDEX_NONE = 2**31 - 1  # "no candidate" for the min-index reduction


def order_key(bits):
    """int32 key of the float32 whose bit pattern is ``bits`` (an int32 expression over registers).

    Non-negative floats keep their bits, negative ones become ``-(bits & 0x7fffffff)`` (so
    ``-0.0`` -> 0 like ``+0.0``), every NaN becomes ``INT32_MAX``.  Strictly monotone on the
    non-NaN floats modulo the sign of zero.
    """
    mag = bits & 0x7FFFFFFF
    return T.if_then_else(mag > 0x7F800000, KEY_NAN, T.if_then_else(bits < 0, -mag, mag))


def float_key(value):
    """:func:`order_key` of a float32 expression (reinterpreted, never converted: no flush)."""
    return order_key(T.reinterpret(value, "int32"))


def key_value(key):
    """A float32 whose order key is ``key`` (``KEY_NAN`` -> a NaN, 0 -> +0.0).

    Exact but for the sign of zero and NaN payloads, neither of which changes the key of a sum
    of such floats: adding the values of two keys keys the same as adding the original floats.
    """
    return T.reinterpret(T.if_then_else(key >= 0, key, T.bitwise_or(-key, T.int32(-(2**31)))), "float32")


@T.macro
def pick_next(keys, slots: int, lane):
    """One stable selection step over the warp: returns the index of the largest key (lowest
    index on ties), the same in every lane, and sets the winning slot's key to ``KEY_GONE``.
    ``keys`` is the lane's ``[slots]`` int32 register array.  The whole warp must call it
    (full-mask reductions).
    """
    best = T.alloc_var("int32", init=KEY_GONE)
    best_slot = T.alloc_var("int32", init=0)
    for j in T.unroll(slots):
        if keys[j] > best:  # strict: the lowest slot (lowest expert) wins ties inside the lane
            best = keys[j]
            best_slot = j
    top = T.warp_reduce_max(best)
    winner = T.warp_reduce_min(T.if_then_else(best == top, best_slot * 32 + lane, INDEX_NONE))
    for j in T.unroll(slots):
        if j * 32 + lane == winner:
            keys[j] = KEY_GONE
    return winner


@T.macro
def group_rank(src, row, lane, num_groups, per_group, num_topk_sum, grouped_dims: bool):
    """Rank of group ``lane`` by the sum of its ``num_topk_sum`` (1 or 2) largest values.

    Group ``g`` is ``src[row, g * per_group : (g + 1) * per_group]``, or ``src[row, g, :]``
    when ``grouped_dims`` (a 3-D source).  Lane ``g < num_groups`` finds its group's largest
    two values by order key (ties keep the earlier value; the sum is the same), adds them in float32 and keys the sum; the rank is the number of
    groups whose key is larger, or equal with a lower index (``torch.sort(descending=True,
    stable=True)`` of the group sums).  Lanes ``>= num_groups`` return junk.  The whole warp
    must call it (``num_groups <= 32``; the shuffles use the full mask).
    """
    key1 = T.alloc_var("int32", init=KEY_GONE)
    key2 = T.alloc_var("int32", init=KEY_GONE)
    val1 = T.alloc_var("float32", init=0.0)
    val2 = T.alloc_var("float32", init=0.0)
    cur = T.alloc_var("float32", init=0.0)
    cur_key = T.alloc_var("int32", init=0)
    group_key = T.alloc_var("int32", init=KEY_GONE)
    rank = T.alloc_var("int32", init=0)
    if lane < num_groups:
        start = T.truncmod(lane, per_group)  # rotate the scan so lanes hit different shared-memory banks
        for i in T.serial(per_group):
            if grouped_dims:
                cur = src[row, lane, T.if_then_else(i + start < per_group, i + start, i + start - per_group)]
            else:
                cur = src[row, lane * per_group + T.if_then_else(i + start < per_group, i + start, i + start - per_group)]
            cur_key = float_key(cur)
            if cur_key > key1:
                key2 = key1
                val2 = val1
                key1 = cur_key
                val1 = cur
            elif cur_key > key2:
                key2 = cur_key
                val2 = cur
        if num_topk_sum == 2:
            cur = val1 + val2
        else:
            cur = val1
        group_key = float_key(cur)
    for h in T.serial(num_groups):
        cur_key = T.shfl_sync(group_key, h)
        if cur_key > group_key or (cur_key == group_key and h < lane):
            rank = rank + 1
    return rank
