"""Small, odd-shaped calls of every op of ``tilebin.ops`` for compute-sanitizer (memcheck/racecheck).

    compute-sanitizer --tool memcheck python3 wheels/sanitize_ops.py [quant|moe|transpose|all]

Each call runs on the installed wheel and is synchronised; an exception prints ``FAILED`` with
the call.  Correctness is the GPU suite's job: this script exists so that out-of-bounds
accesses at partial tiles (odd token counts, hidden sizes that are not multiples of a tile,
partial scale groups) show up as sanitizer errors.  Exit status 1 when any call raised.
"""

from __future__ import annotations

import sys
import traceback

import torch

TOKENS = (1, 3, 33)


def _bf16(t: int, h: int) -> torch.Tensor:
    return torch.randn(t, h, device="cuda", dtype=torch.bfloat16)


def quant_calls():
    from tilebin.ops import quant as q

    for t in TOKENS:
        for h in (576, 2048):
            x = _bf16(t, h)
            for fmt in ("e4m3", "e2m1"):
                for n in (32, 128, h):
                    yield f"per_token_cast({t}x{h}, {fmt}, {n})", lambda x=x, fmt=fmt, n=n: q.per_token_cast(x, fmt, n)
                yield (f"per_token_cast({t}x{h}, {fmt}, 128, ue8m0)",
                       lambda x=x, fmt=fmt: q.per_token_cast(x, fmt, 128, use_tma_aligned_col_major_sf=True,
                                                             round_sf=True, use_packed_ue8m0=True))
                for block in ((128, 128), (32, 32)):
                    yield (f"per_block_cast({t}x{h}, {fmt}, {block})",
                           lambda x=x, fmt=fmt, block=block: q.per_block_cast(x, fmt, block))
            yield f"per_token_cast({t}x{h}, e5m6, {h})", lambda x=x, h=h: q.per_token_cast(x, "e5m6", h)
            yield (f"cast_back(e5m6 {t}x{h})",
                   lambda x=x, h=h: q.per_token_cast_back(q.per_token_cast(x, "e5m6", h), "bf16", h, "e5m6"))
            yield f"per_channel_cast({t}x{h})", lambda x=x: q.per_channel_cast(x, "e4m3", 128)
            yield f"per_channel_cast_and_transpose({t}x{h})", lambda x=x: q.per_channel_cast_and_transpose(x, "e4m3", 128)
            yield (f"cast_back(per_token e4m3 {t}x{h})",
                   lambda x=x: q.per_token_cast_back(q.per_token_cast(x, "e4m3", 128), "bf16", 128))
            yield (f"cast_back(per_token e2m1 {t}x{h})",
                   lambda x=x: q.per_token_cast_back(q.per_token_cast(x, "e2m1", 32), "fp32", 32))
            packed = q.per_token_cast(x, "e2m1", 32)[0]  # int8 [t, h / 2]; an odd byte count exercises the tail
            for out_dtype in (torch.float32, torch.bfloat16):
                yield (f"unpack_from_e2m1fn_x2({t}x{h // 2}, {out_dtype})",
                       lambda p=packed, d=out_dtype: q.unpack_from_e2m1fn_x2(p, d))
            yield (f"unpack_from_e2m1fn_x2({t}x{h // 2 - 1}, bf16)",
                   lambda p=packed: q.unpack_from_e2m1fn_x2(p[:, :-1].contiguous(), torch.bfloat16))
            for col, ue8m0 in ((False, False), (True, False), (True, True)):  # the lossless cast's input layouts
                pair = q.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=col, round_sf=True,
                                        use_packed_ue8m0=ue8m0)
                for block, out_col, out_ue8m0 in (((1, 128), False, False), ((32, 32), True, False),
                                                  ((128, 128), True, True)):
                    yield (f"per_block_cast_lossless({t}x{h}, in {'ue8m0' if ue8m0 else 'col' if col else 'row'}, "
                           f"{block})", lambda p=pair, b=block, c=out_col, u=out_ue8m0: q.per_block_cast_lossless(
                               p, "e4m3", (1, 32), b, use_tma_aligned_col_major_sf=c, round_sf=True, use_packed_ue8m0=u))
            x2 = _bf16(t, 2 * h)
            yield f"swiglu_forward_and_per_token_cast({t}x{2 * h})", lambda x2=x2: q.swiglu_forward_and_per_token_cast(
                x2, "e4m3", 128)
            x3 = _bf16(128 * t, 2 * h)  # its token count must be a multiple of 128
            yield (f"swiglu_forward_and_per_channel_cast_and_transpose({128 * t}x{2 * h})",
                   lambda x3=x3: q.swiglu_forward_and_per_channel_cast_and_transpose(x3, "e4m3", 128))


def moe_calls():
    from tilebin.ops import moe

    for t in TOKENS + (4097,):
        for experts, topk, groups in ((256, 8, 8), (72, 6, 4)):
            scores = torch.randn(t, experts, device="cuda", dtype=torch.float32)
            bias = torch.randn(experts, device="cuda", dtype=torch.float32)
            idx = torch.stack([torch.randperm(experts, device="cuda")[:topk] for _ in range(t)])
            w = torch.rand(t, topk, device="cuda", dtype=torch.float32)
            tag = f"{t} tokens, {experts} experts, top-{topk}"
            yield f"topk_gate({tag})", lambda s=scores, k=topk: moe.topk_gate(s, k)
            for scoring in ("sigmoid", "sqrtsoftplus", "softmax"):
                yield (f"top2_sum_gate({tag}, {scoring})",
                       lambda s=scores, b=bias, k=topk, g=groups, f=scoring: moe.top2_sum_gate(
                           s, b, k, 2, g, False, 0, 1.5, 0, 1, 0, 1, f))
            yield f"normalize_weight({tag})", lambda w=w: moe.normalize_weight(w)
            yield f"group_count({tag})", lambda i=idx, g=groups, e=experts: moe.group_count(i // (e // g), g)
            yield f"aux_fi({tag})", lambda i=idx, e=experts, k=topk: moe.aux_fi(i, e, k)
            yield f"mask_indices_by_tp({tag})", lambda i=idx, e=experts: moe.mask_indices_by_tp(i, e, 4, 1, 2)
            yield f"get_fused_mapping({tag})", lambda i=idx, e=experts: moe.get_fused_mapping(i, e, 0, 16)
            x = torch.randn(t, 576, device="cuda", dtype=torch.bfloat16)

            def expand_reduce(i=idx, e=experts, x=x, w=w):
                m = moe.get_fused_mapping(i, e, 0, 16)
                y = moe.expand_to_fused(x, m[3], m[0])
                return moe.reduce_fused(y, w, m[3])

            yield f"expand_to_fused + reduce_fused({tag}, hidden 576)", expand_reduce


def transpose_calls():
    from tilebin.ops import transpose as tr

    for dtype in (torch.bfloat16, torch.float32, torch.float8_e4m3fn):
        name = str(dtype).removeprefix("torch.")
        # decode rows (48 and 64, multiples of 16 bytes: transpose.batched_transpose_direct, 48 in partial
        # tiles; 1, 3 and 33: the 2-warp ``small`` tiles), odd sizes
        for shape in ((1, 7168), (3, 7168), (33, 7168), (48, 7168), (64, 7168), (129, 257)):
            x = torch.randn(shape, device="cuda").to(dtype)
            yield f"transpose({'x'.join(map(str, shape))}, {name})", lambda x=x: tr.transpose(x)
        # enough blocks for transpose.batched_transpose_warps, every edge tile partial but 16-byte aligned
        x = torch.randn(16, 208, 4112, device="cuda").to(dtype)
        yield f"batched_transpose(16x208x4112, {name})", lambda x=x: tr.batched_transpose(x)


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    groups = {"quant": quant_calls, "moe": moe_calls, "transpose": transpose_calls}
    bad = 0
    for name, calls in groups.items():
        if which not in ("all", name):
            continue
        for what, call in calls():
            try:
                call()
                torch.cuda.synchronize()
                print("OK", what, flush=True)
            except Exception as exc:
                bad += 1
                print("FAILED", what, repr(exc)[:400], flush=True)
                if not isinstance(exc, (TypeError, AttributeError, ValueError)):
                    traceback.print_exc(limit=3)
    print(f"{bad} failed call(s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
