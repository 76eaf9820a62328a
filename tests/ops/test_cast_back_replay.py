"""cast_back, per_token_cast_back and unpack_from_e2m1fn_x2 through their OpSpecs (CPU, no GPU: the
launcher records, the device check passes).

A configuration is memoized (``SPEC.memo``) only after the checked path accepted it; a later call
of the same configuration replays it with the per-call checks only.  Here every replayed call is
compared with the checked path on the same arguments (memo emptied): the same kernel, key and
scalar arguments, tensor arguments of the same dtype/shape/strides (the same objects where the
checked path passes an input through), outputs of the same dtype/shape/strides; and everything
the checked path refuses is still refused once the memo is warm, with the same message, with no
launch and nothing stored.
"""

from __future__ import annotations

import pytest
import torch

import replay_util
from replay_util import assert_same, misaligned as _misaligned
from tilebin.ops.quant import _cast_back as cb

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

BF16, FP32, E4M3, I8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int8
CAST_BACK, PER_TOKEN = cb.CAST_BACK, cb.PER_TOKEN_CAST_BACK


class Recorder(replay_util.Recorder):
    def raises(self, spec, match: str, fn, *args, replayed: bool = False):
        """:func:`replay_util.raises` of ``fn(*args)``."""
        replay_util.raises(self, spec, match, fn, *args, replayed=replayed)


@pytest.fixture
def rec(monkeypatch):
    return Recorder(monkeypatch)


def _data(tokens, hidden, dtype):
    if dtype == I8:
        return torch.randint(-128, 128, (tokens, hidden // 2), dtype=I8)
    return torch.randn(tokens, hidden).clamp(-400, 400).to(E4M3)


def _sf(tokens, hidden, block, kind):
    m, k = -(-tokens // block[0]), -(-hidden // block[1])
    if kind == "row":
        return torch.rand(m, k) + 0.5
    if kind == "col":
        return (torch.rand(k, m) + 0.5).T
    return torch.randint(100, 140, (-(-k // 4), m), dtype=torch.int32).T  # packed UE8M0, column-major


def _cb(data, sf, fmt, block, special=None):
    return lambda: cb.cast_back((data, sf), fmt, block, special)


def _cb_both(rec, data, sf, fmt, block, special=None):
    """The replayed call and the checked call on the same arguments agree."""
    slow = rec.checked_run(CAST_BACK, _cb(data, sf, fmt, block, special))
    fast = rec.run(_cb(data, sf, fmt, block, special), fast=True)
    assert_same(slow, fast, [data, sf])
    return fast


# ------------------------------------------------------------------------------ the declarations
def test_schemas_stay_as_registered():
    assert CAST_BACK.schema() == ("(Tensor x, Tensor x_sf, str fmt, int[] x_block_size, str? x_special_fmt=None) "
                                  "-> Tensor")
    assert PER_TOKEN.schema() == ("(Tensor x, Tensor x_sf, str fmt, int num_per_channels, str? x_special_fmt=None) "
                                  "-> Tensor")
    assert cb.UNPACK_FROM_E2M1FN_X2.schema() == "(Tensor x, ScalarType out_dtype) -> Tensor"
    assert [op.schema for op in cb.TORCH_OPS] == [spec.schema() for spec in cb.SPECS]
    assert [op.public for op in cb.TORCH_OPS] == [cb.cast_back, cb.per_token_cast_back, cb.unpack_from_e2m1fn_x2]


# ------------------------------------------------------------------------------------ cast_back
@pytest.mark.parametrize("dtype", [E4M3, I8])
@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
@pytest.mark.parametrize("hidden, block", [(576, (1, 128)), (576, (1, 32)), (7168, (1, 128)), (576, (128, 128)),
                                           (576, (32, 32)), (576, (1, 576)), (576, (1, 64)), (1024, (1, 1024))])
@pytest.mark.parametrize("kind", ["row", "col", "ue8m0"])
def test_cast_back_replay_matches_checked(rec, dtype, fmt, hidden, block, kind):
    rec.run(_cb(_data(4, hidden, dtype), _sf(4, hidden, block, kind), fmt, block), fast=False)
    assert len(CAST_BACK.memo) == 1
    for tokens in (4, 0, 1, 7, 300):
        _cb_both(rec, _data(tokens, hidden, dtype), _sf(tokens, hidden, block, kind), fmt, block)
    assert len(CAST_BACK.memo) == 1


def test_per_token_cast_back_replay(rec):
    data, sf = _data(4, 576, E4M3), _sf(4, 576, (1, 128), "row")
    call = lambda: cb.per_token_cast_back((data, sf), "bf16", 128)  # noqa: E731
    rec.run(call, fast=False)
    assert_same(rec.checked_run(PER_TOKEN, call), rec.run(call, fast=True), [data, sf])
    one = torch.rand(4, 1)  # one scale per token: strides (1, 1), read as column-major (the checks' rule)
    call = lambda: cb.per_token_cast_back((data, one), "bf16", 576)  # noqa: E731
    rec.run(call, fast=False)
    slow = rec.checked_run(PER_TOKEN, call)
    assert_same(slow, rec.run(call, fast=True), [data, one])
    assert slow[1][0][1]["sf_kind"] == "col"
    assert len(PER_TOKEN.memo) == 2 and not CAST_BACK.memo  # its own memo


def test_cast_back_data_layouts(rec):
    """Non-contiguous or misaligned data is copied, as by the checked path."""
    block = (1, 128)
    rec.run(_cb(_data(4, 576, E4M3), _sf(4, 576, block, "row"), "bf16", block), fast=False)
    wide = _data(5, 640, E4M3)
    for data in (wide[:4, :576], wide[1:, 64:640], _misaligned((4, 576), FP32).to(E4M3)[:, :], wide[::2, :576]):
        _cb_both(rec, data, _sf(data.shape[0], 576, block, "row"), "bf16", block)
    flat = torch.zeros(4 * 576 + 1, dtype=torch.uint8)
    _cb_both(rec, flat[1:].view(E4M3).view(4, 576), _sf(4, 576, block, "row"), "bf16", block)
    # a row-major sf with a row stride (a slice of a wider one) passes as is
    sf = (torch.rand(4, 9) + 0.5)[:, :5]
    _cb_both(rec, _data(4, 576, E4M3), sf, "bf16", block)
    # a misaligned sf is copied (the kernel's vector loads)
    (_, [(_, _, args)]) = _cb_both(rec, _data(4, 576, E4M3), _misaligned((4, 5), FP32), "bf16", block)
    assert args[1].data_ptr() % 16 == 0


def test_cast_back_token_block_not_power_of_two(rec):
    """A token block that is not a power of two serves up to that many tokens (one sf row): the
    replay checks the token count against it on every call."""
    block = (3, 128)
    rec.run(_cb(_data(2, 576, E4M3), _sf(2, 576, block, "row"), "bf16", block), fast=False)
    for tokens in (3, 1, 2):
        _, [(_, _, args)] = _cb_both(rec, _data(tokens, 576, E4M3), _sf(tokens, 576, block, "row"), "bf16", block)
        assert args[3:] == (31, 7)  # the whole token range in one block
    _cb_both(rec, _data(0, 576, E4M3), _sf(0, 576, block, "row"), "bf16", block)
    assert len(CAST_BACK.memo) == 1
    msg = r"cast_back: x_block_size tokens per scale=3 is not supported for a dimension of 4"
    rec.raises(CAST_BACK, msg, cb.cast_back, (_data(4, 576, E4M3), _sf(4, 576, block, "row")), "bf16", block,
               replayed=True)
    rec.raises(CAST_BACK, msg, cb.cast_back, (_data(4, 576, E4M3), _sf(3, 576, block, "row")), "bf16", block,
               replayed=True)


def test_cast_back_refusals_after_warm(rec):
    block = (1, 128)
    data, sf = _data(4, 576, E4M3), _sf(4, 576, block, "row")
    for kind in ("row", "col", "ue8m0"):
        s = _sf(4, 576, block, kind)
        rec.run(_cb(data, s, "bf16", block), fast=False)
        rec.run(_cb(data, s, "bf16", block), fast=True)
    assert len(CAST_BACK.memo) == 3
    op, r = "cast_back", lambda match, *args: rec.raises(CAST_BACK, match, cb.cast_back, *args)
    rec.raises(CAST_BACK, rf"{op}: x's sf has shape \(5, 5\)", cb.cast_back, (data, _sf(5, 576, block, "row")),
               "bf16", block, replayed=True)
    r(rf"{op}: x's sf has shape \(4, 6\)", (data, torch.ones(4, 6)), "bf16", block)
    rec.raises(CAST_BACK, rf"{op}: x's sf has shape \(3, 5\)", cb.cast_back, (data, _sf(3, 576, block, "col")),
               "bf16", block, replayed=True)
    r(rf"{op}: x's sf has shape \(4, 1\)", (data, _sf(4, 576, (1, 1024), "ue8m0")), "bf16", block)
    r(rf"{op}: row-major input sf must be float32 with stride\(1\) == 1", (data, torch.ones(4, 10)[:, ::2]), "bf16",
      block)
    r(rf"{op}: x_block_size channels per scale must be a positive int, got 128.0", (data, sf), "bf16", (1, 128.0))
    r(rf"{op}: x_block_size tokens per scale must be a positive int, got True", (data, sf), "bf16", (True, 128))
    r(rf"{op}: x_block_size must be a \(rows, cols\) tuple", (data, sf), "bf16", [1, 128])
    r(rf"{op}: x must be a \(data, sf\) tuple, got list", [data, sf], "bf16", block)
    r(rf"{op}: x must be a \(data, sf\) tuple, got tuple", (data, sf, sf), "bf16", block)
    r(rf"{op}: fmt='fp16' is not supported", (data, sf), "fp16", block)
    r(rf"{op}: x_special_fmt='e4m3' is not supported", (data, sf), "bf16", block, "e4m3")
    r(rf"{op}: x_special_fmt='e5m6' needs uint8", (data, sf), "bf16", block, "e5m6")
    r(rf"{op}: hidden=560 is not supported", (_data(4, 560, E4M3), torch.ones(4, 5)), "bf16", block)
    r(rf"{op}: quantized data has dtype torch.float32", (data.float(), sf), "bf16", block)
    r(rf"{op}: the input's sf must be a 2-D tensor", (data, sf[None]), "bf16", block)
    r(rf"{op}: the input's sf must be a 2-D tensor", (data, 1.0), "bf16", block)
    r(rf"{op}: column-major input sf has dtype torch.float64", (data, _sf(4, 576, block, "col").double()), "bf16",
      block)
    r(rf"{op}: x's data must be 2-D", (data[None], sf), "bf16", block)
    assert len(CAST_BACK.memo) == 3


def test_per_call_checks_after_warm(rec):
    """The token count is not part of the configuration: the sf's rows are checked against it
    on every call (refused as cold, no launch, nothing stored), for both ops."""
    data = _data(4, 576, E4M3)
    for kind in ("row", "col", "ue8m0"):
        sf = _sf(4, 576, (1, 128), kind)
        for _ in range(2):
            cb.cast_back((data, sf), "bf16", (1, 128))
            cb.per_token_cast_back((data, sf), "fp32", 128)
        for tokens in (3, 5, 0):  # an sf of another token count, same configuration
            other = _sf(tokens, 576, (1, 128), kind)
            rec.raises(CAST_BACK, r"cast_back: x's sf has shape", cb.cast_back, (data, other), "bf16", (1, 128),
                       replayed=True)
            rec.raises(PER_TOKEN, r"cast_back: x's sf has shape", cb.per_token_cast_back, (data, other), "fp32", 128,
                       replayed=True)
            rec.raises(CAST_BACK, r"cast_back: x's sf has shape", cb.cast_back, (_data(tokens, 576, E4M3), sf),
                       "bf16", (1, 128), replayed=True)
    big = _sf(4, 576, (128, 128), "row")  # one row of scales for 1..128 tokens
    cb.cast_back((data, big), "bf16", (128, 128))
    rec.raises(CAST_BACK, r"cast_back: x's sf has shape \(1, 5\) but blocks \(128, 128\) of a 129 x 576 input need "
               r"\(2, 5\)", cb.cast_back, (_data(129, 576, E4M3), big), "bf16", (128, 128), replayed=True)


def test_cast_back_int32_limit_after_warm(rec):
    """The 32-bit element limit is checked per call (meta tensors: no memory), for both ops."""
    small = torch.empty(4, 4096, dtype=E4M3, device="meta")
    big = torch.empty(2**19, 4096, dtype=E4M3, device="meta")
    for spec, call in ((CAST_BACK, lambda x: cb.cast_back(x, "bf16", (1, 128))),
                       (PER_TOKEN, lambda x: cb.per_token_cast_back(x, "bf16", 128))):
        rec.run(lambda: call((small, torch.empty(4, 32, device="meta"))), fast=False)
        rec.run(lambda: call((small, torch.empty(4, 32, device="meta"))), fast=True)
        rec.raises(spec, r"cast_back: the output has 2147483648 elements", call,
                   (big, torch.empty(2**19, 32, device="meta")), replayed=True)
        rec.run(lambda: call((big[:-1], torch.empty(2**19 - 1, 32, device="meta"))), fast=True)
    packed = torch.empty(2**19, 2048, dtype=I8, device="meta")  # e2m1: two values a byte
    rec.run(lambda: cb.cast_back((packed[:4], torch.empty(4, 32, device="meta")), "bf16", (1, 128)), fast=False)
    rec.raises(CAST_BACK, r"cast_back: the output has 2147483648 elements", cb.cast_back,
               (packed, torch.empty(2**19, 32, device="meta")), "bf16", (1, 128), replayed=True)


def test_cast_back_e5m6_replay(rec):
    block = (1, 128)
    data = torch.randint(0, 256, (4, 576 * 3 // 2), dtype=torch.uint8)
    sf = _sf(4, 576, block, "row")
    rec.run(_cb(data, sf, "bf16", block, "e5m6"), fast=False)
    fast = _cb_both(rec, data, sf, "bf16", block, "e5m6")
    assert fast[1][0][0] == "quant.cast_back_e5m6"
    rec.raises(CAST_BACK, r"cast_back: x's data has dtype torch.uint8", cb.cast_back, (data, sf), "bf16", block)


def test_other_configurations_miss(rec):
    data, sf = _data(4, 576, E4M3), _sf(4, 576, (1, 128), "row")
    rec.run(_cb(data, sf, "bf16", (1, 128)), fast=False)
    for call in (_cb(data, sf, "fp32", (1, 128)), _cb(data[:, :512], sf[:, :4], "bf16", (1, 128)),
                 _cb(data, sf.T.contiguous().T, "bf16", (1, 128)),  # column-major
                 _cb(data.view(I8)[:, :288], _sf(4, 576, (1, 64), "row"), "bf16", (1, 64)),  # packed e2m1
                 _cb(torch.empty(4, 576, dtype=E4M3, device="meta"), sf, "bf16", (1, 128))):  # another device
        rec.run(call, fast=False)
        rec.run(call, fast=True)
    assert len(CAST_BACK.memo) == 6
    rec.run(lambda: cb.cast_back((data, sf), "bf16", (1, 128), None), fast=True)


# ---------------------------------------------------------------------------- unpack_from_e2m1fn_x2
def test_unpack_replay(rec):
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(I8)
    rec.run(lambda: cb.unpack_from_e2m1fn_x2(every.reshape(16, 16)), fast=False)
    for x in (every.reshape(16, 16), every.reshape(4, 64), every.reshape(16, 16)[:, 3:9]):
        slow = rec.checked_run(cb.UNPACK_FROM_E2M1FN_X2, lambda: cb.unpack_from_e2m1fn_x2(x))[0]
        fast = rec.run(lambda: cb.unpack_from_e2m1fn_x2(x), fast=True)[0]
        assert torch.equal(slow, fast) and slow.stride() == fast.stride() and fast.dtype == FP32
    assert len(cb.UNPACK_FROM_E2M1FN_X2.memo) == 1
    rec.run(lambda: cb.unpack_from_e2m1fn_x2(every, BF16), fast=False)  # another rank and dtype
    assert not rec.calls
    spec, op = cb.UNPACK_FROM_E2M1FN_X2, "unpack_from_e2m1fn_x2"
    rec.raises(spec, rf"{op}: x has dtype torch.float32", cb.unpack_from_e2m1fn_x2, torch.zeros(4, 4))
    rec.raises(spec, rf"{op}: x must have at least 1 dimension", cb.unpack_from_e2m1fn_x2, every[0])
    rec.raises(spec, rf"{op}: out_dtype must be a torch.dtype, got 'float32'", cb.unpack_from_e2m1fn_x2, every,
               "float32")


# ------------------------------------------------------------- the hot calls, spelled out in full
def test_hot_launches_explicit(rec):
    """The launches both paths make for the decode-size hot calls, written out (independent of
    the ops' own arithmetic)."""
    data, sf = torch.zeros(4, 7168, dtype=E4M3), torch.ones(4, 56)
    for fast in (False, True):
        out, [(name, key, args)] = rec.run(lambda: cb.per_token_cast_back((data, sf), "bf16", 128), fast=fast)
        assert name == "quant.cast_back" and key == dict(in_fmt="e4m3", out_dtype="bfloat16", sf_kind="row")
        assert args[0] is data and args[1] is sf and args[2] is out and args[3:] == (0, 7)
        assert (out.dtype, out.shape, out.stride()) == (BF16, (4, 7168), (7168, 1))
    col = torch.ones(56, 4).T
    for fast in (False, True):
        out, [(name, key, args)] = rec.run(lambda: cb.cast_back((data, col), "fp32", (1, 128)), fast=fast)
        assert name == "quant.cast_back" and key == dict(in_fmt="e4m3", out_dtype="float32", sf_kind="col")
        assert args[0] is data and args[2] is out and args[3:] == (0, 7)
        assert (args[1].shape, args[1].stride()) == ((56, 4), (4, 1)) and args[1].data_ptr() == col.data_ptr()
        assert (out.dtype, out.shape, out.stride()) == (FP32, (4, 7168), (7168, 1))
