"""The e2m1 encoder of the quant kernels (``kernels/quant/_formats.py:e2m1_code``), on the CPU.

``e2m1_code`` builds its TileLang expression from ``_e2m1_steps``; ``_e2m1_code_numpy`` runs the
very same steps on numpy arrays (fp32 arithmetic rounds alike on both; ``min`` on fp32 is IEEE
minNum on both: CUDA ``min(float, float)`` is ``fminf``, the numpy twin ``np.fmin``).  Here the
numpy twin is held against the reference ``quant_ref.e2m1_bits`` on every sign / exponent pair
with the mantissas that matter for rounding (every tie point of the grid and its fp32
neighbours), plus specials and random patterns.  (The twin was also checked over all 2**32 fp32
bit patterns once, outside the suite: no difference.)
"""

import numpy as np
import pytest
import torch

import quant_ref as q
from tilebin.kernels.quant import _formats as F

E2M1_TABLE = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _ref(values: np.ndarray) -> np.ndarray:
    return q.e2m1_bits(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))).numpy().astype(np.uint32)


def _check(bits: np.ndarray) -> None:
    bits = np.ascontiguousarray(bits, dtype=np.uint32)
    values = bits.view(np.float32)
    got = F._e2m1_code_numpy(values)
    assert got.dtype == np.uint32
    want = _ref(values)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, "e2m1 encoder != reference for " + ", ".join(
        f"0x{int(bits[i]):08x} (got {int(got[i])}, want {int(want[i])})" for i in bad[:8])


def _neighbours(points) -> np.ndarray:
    """fp32 bits of every point and its 3 neighbours on each side, both signs."""
    base = np.asarray(points, dtype=np.float32).view(np.uint32).astype(np.int64)
    near = (base[:, None] + np.arange(-3, 4)[None, :]).ravel()
    near = near[(near >= 0) & (near <= 0x7FFFFFFF)].astype(np.uint32)
    return np.concatenate([near, near | np.uint32(0x80000000)])


def test_every_sign_and_exponent_with_rounding_mantissas():
    # mantissas around every place a 1-bit (or coarser) RNE can turn: the kept bit, the half
    # point below it, and their neighbours; plus the ends of the field
    mants = set()
    for m in (0x000000, 0x100000, 0x200000, 0x300000, 0x400000, 0x500000, 0x600000, 0x700000, 0x7FFFFF):
        mants.update(x for x in range(m - 2, m + 3) if 0 <= x <= 0x7FFFFF)
    mants.update((0x3FFFFF, 0x0FFFFF, 0x1FFFFF, 0x5FFFFF, 0x155555, 0x2AAAAA, 0x555555, 0x6AAAAA))
    rng = np.random.default_rng(7)
    mant = np.concatenate([np.array(sorted(mants), dtype=np.uint32), rng.integers(0, 1 << 23, 64, dtype=np.uint32)])
    sign_exp = np.arange(512, dtype=np.uint32)  # 9 bits: sign and the 8 exponent bits
    _check(((sign_exp[:, None] << np.uint32(23)) | mant[None, :]).ravel())


def test_tie_points_and_their_neighbours():
    ties = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
    _check(_neighbours(ties + E2M1_TABLE + (6.5, 7.0, 8.0, 12.0, 1e30)))


def test_hand_computed_ties_round_to_even_and_saturate():
    values = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 1e38, 0.2500001, 5.0000005], dtype=np.float32)
    want = [0, 2, 2, 4, 4, 6, 6, 7, 7, 7, 1, 7]
    assert F._e2m1_code_numpy(values).tolist() == want
    assert F._e2m1_code_numpy(-values).tolist() == [w | 8 for w in want]


def test_grid_values_encode_to_their_codes():
    values = np.array(E2M1_TABLE, dtype=np.float32)
    assert F._e2m1_code_numpy(values).tolist() == list(range(8))
    assert F._e2m1_code_numpy(-values).tolist() == list(range(8, 16))  # -0.0 -> 8


def test_specials_zero_denormals_inf_nan():
    specials = np.array([
        0x00000000, 0x80000000,  # +-0
        0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000, 0x00000002,  # denormals
        0x00800000, 0x80800000,  # smallest normals
        0x7F800000, 0xFF800000,  # +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000,  # NaNs
        0x7F7FFFFF, 0xFF7FFFFF,  # +-max finite
    ], dtype=np.uint32)
    _check(specials)
    codes = F._e2m1_code_numpy(specials.view(np.float32)).tolist()
    assert codes[:2] == [0, 8] and codes[10:12] == [7, 15]
    assert codes[12:19] == [7, 15, 7, 15, 7, 15, 7]  # NaN saturates, its sign kept


def test_random_bit_patterns():
    rng = np.random.default_rng(2024)
    _check(rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32))
    # the range the kernels actually see: |x * sf_inv| <= ~6
    vals = rng.uniform(-6.5, 6.5, 1 << 18).astype(np.float32)
    _check(vals.view(np.uint32))


def test_tir_builder_runs_the_same_steps():
    """``e2m1_code`` and the numpy twin are both ``_e2m1_steps``; the TileLang expression is built
    from the same constants (a drift between the two would have to edit ``_e2m1_steps``)."""
    T = pytest.importorskip("tilelang.language")

    v = T.Var("v", "float32")
    expr = F.e2m1_code(v)
    assert expr.dtype == "uint32"
    text = str(expr)
    for const in ("4194307", "2139095040"):
        assert const in text, f"{const} missing from the TIR of e2m1_code: {text}"
    seen = []

    class Spy(F._TirOps):
        @staticmethod
        def fmin(a, b):
            seen.append("fmin")
            return T.min(a, b)

    F._e2m1_steps(Spy, v)
    assert seen == ["fmin"]
    # packing keeps its shape: two nibbles per byte, eight per word
    assert F.e2m1_pack2(v, v).dtype == "uint8"
    assert F.e2m1_pack_word([v] * 8).dtype == "uint32"


def test_pack_order_matches_reference_packing():
    rng = np.random.default_rng(5)
    vals = rng.uniform(-7, 7, 64).astype(np.float32)
    codes = F._e2m1_code_numpy(vals)
    words = np.zeros(8, dtype=np.uint32)
    for w in range(8):  # what e2m1_pack_word builds: element j of a group of 8 at nibble j
        for j in range(8):
            words[w] |= np.uint32(codes[8 * w + j]) << np.uint32(4 * j)
    ref = q.pack_e2m1(torch.from_numpy(codes.astype(np.uint8)).reshape(1, -1)).numpy().view(np.uint8).reshape(-1)
    assert words.view(np.uint8).tolist() == ref.tolist()
