"""``transpose.batched_transpose(x, out)``: ``out[b] = x[b].T`` for contiguous 3-D tensors.

x is ``[batch, rows, cols]``, out is ``[batch, cols, rows]``, both of the variant's dtype
(bfloat16, float32 or float8_e4m3fn).  ``transpose.transpose_tiled`` is the same kernel with 2-D x
``[rows, cols]`` and out ``[cols, rows]`` (one batch), so a 2-D op call needs no 3-D views.  batch, rows and cols are runtime symbols; any of
them may be 1 or odd.  A zero extent gives an empty grid, which the launcher must skip.
The data pointers must be 16-byte aligned (the declaration's ``align``).  Two variants per
dtype, both correct for every shape: ``small=False`` (8 warps per block) and ``small=True``
(2 warps); ``tilebin.ops.transpose`` launches this kernel where rows or cols are not
multiples of ``VEC`` (aligned shapes take ``transpose.batched_transpose_warps``, or
``transpose.batched_transpose_direct`` at decode sizes), with ``small`` when the 8-warp tiles
would give fewer than two blocks per SM.  Dynamic shared memory: 32 KB (bf16), 16 KB (fp32), 64 KB (fp8, above
the 48 KB default); a quarter of that with ``small``.

Measured on an H200 (µs; ``bench/compare_peer.py``, tile_kernels' time in brackets):
8192 x 7168 bf16 63.1 (59.1), fp32 118.8 (118.1), fp8 34.8 (31.9); batched 8 x 4096 x 4096
bf16 134.7 (130.9); 4001 x 7168 bf16 45.0 (tile_kernels refuses rows not a multiple of 64);
decode bf16 1 / 4 / 16 / 64 / 128 x 7168: 2.2 / 2.3 / 2.8 / 3.1 (2.2) / 3.8 (3.0).

Design:

* ``VEC = 16 // element_size`` elements make one 16-byte vector (8 bf16, 4 fp32, 16 fp8).
  Each thread owns a ``VEC x VEC`` block: ``VEC`` independent 16-byte loads (one per row of
  x, all in flight before the first use), a transpose in registers on 32-bit words (fp32:
  renaming; bf16: one ``__byte_perm``/PRMT per word; fp8: two PRMT stages per 4 x 4 byte
  square), then ``VEC`` 16-byte rows of out.
* Writes are the hard side.  Plain 16-byte stores spread over many rows of out reached
  only ~2.9 TB/s even write-only (loads in the same pattern: ~3.8), so the block stages its
  out tile in shared memory and writes each out row's segment with one bulk asynchronous
  copy (``cp.async.bulk.global.shared::cta``: the 1-D TMA store, no tensor map), which
  wrote at ~4.1 TB/s.  Tried and dropped: plain 16-byte stores for the whole tile (bf16
  2.65-2.8 TB/s), a shared-memory tile with 512-byte coalesced stores (no better), block
  rasterization panels (no effect).
* Lanes: ``lane % 8`` picks the row block, ``lane // 8`` the column vector, so a load
  instruction reads 8 rows x 64 contiguous bytes and a quarter-warp writes 128 contiguous
  bytes of the staged tile (no bank conflicts).  Warps per block ``WARPS_R x WARPS_C``: 2 x 4,
  tile ``TILE_R x TILE_C`` = 128 x 128 (bf16), 64 x 64 (fp32), 256 x 256 (fp8), so every bulk
  store of a full tile is 256 bytes; ``small``: 1 x 2, tiles 64 x 64 / 32 x 32 / 128 x 128,
  for grids too small to fill the SMs (128 x 7168 bf16: 56 blocks of 8 warps on 132 SMs, 224
  of 2).  Row tiles on ``blockIdx.x`` (rows are the long axis), column tiles on ``blockIdx.y``
  and the batch on ``blockIdx.z`` (each at most 65535).
* Three paths, chosen per block (each condition is uniform across the block):
  1. ``rows % VEC == cols % VEC == 0`` (every row of x and out starts 16-byte aligned, as
     vector accesses and bulk copies need): the path above.  A full tile loads with no
     predicate; a partial one predicates its loads (rows or columns past the end read as
     zeros) and gives each valid out row one bulk copy of its valid bytes (a multiple of 16,
     as ``cp.async.bulk`` needs, because ``rows % VEC == 0``), so decode token counts keep
     the fast stores;
  2. ``cols % VEC == 0`` otherwise (an odd row count such as a token count): vector loads
     (rows past the end read as zeros), the same staging, then element stores along out
     rows (a warp writes 32 consecutive elements), bounds-checked;
  3. ``cols % VEC != 0``: element by element with bounds checks (correct, not fast:
     ~0.4-0.6 TB/s).
  16-byte alignment is proven to TileLang by indexing 32-bit word views of x and out whose
  row lengths are ``cols // VEC * 4`` and ``rows // VEC * 4`` words, the true lengths where
  they are used.
* Global indices are 64-bit (TileLang widens them), so batch * rows * cols may exceed 2**31.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T
from tvm import tirx

from .._declare import KernelDecl

# torch dtype name -> (TileLang dtype name, element bytes)
_DTYPES = {
    "bfloat16": ("bfloat16", 2),
    "float32": ("float32", 4),
    "float8_e4m3fn": ("float8_e4m3fn", 1),
}
_INT_OF_SIZE = {1: "uint8", 2: "uint16", 4: "uint32"}
# Blocks per SM to keep resident (caps registers): bf16 measured 4 blocks (64 registers)
# faster than 3; fp8 measured 2 (96 registers) faster than 3 (80, with spills).
_MIN_BLOCKS = {1: 2, 2: 4, 4: 6}
LANES_R, LANES_C = 8, 4  # lane % 8: row block, lane // 8: column vector
_WARPS = {False: (2, 4), True: (1, 2)}  # small -> (WARPS_R, WARPS_C)


def _perm(a, b, selector: int):
    """PRMT: byte n of the result is byte ``selector[n]`` of the pair (a = bytes 0-3, b = 4-7)."""
    return T.call_extern("uint32", "__byte_perm", a, b, T.uint32(selector))


def _view(buf, shape, dtype: str):
    """A view of ``buf``'s data with another shape/dtype.  Called inline, never bound to a name
    in the PrimFunc body: binding a view renames the data pointer, hence the kernel parameter."""
    return T.Tensor(shape, dtype, buf.data)


def word_shapes(vec: int):
    """``(batch, rows, cols, xw_shape, ow_shape)``: the size symbols and the shapes of x's and out's
    32-bit word views, whose row lengths ``cols // vec * 4`` / ``rows // vec * 4`` words prove 16-byte
    aligned rows to TileLang (the true lengths where a kernel's aligned path uses them)."""
    batch, rows, cols = T.dynamic("batch"), T.dynamic("rows"), T.dynamic("cols")
    return batch, rows, cols, (batch, rows, cols // vec * 4), (batch, cols, rows // vec * 4)


def _bulk_store(gmem_ptr, smem_ptr, nbytes: int):
    """``cp.async.bulk.global.shared::cta`` (TileLang's ``tl.tma_store`` with a plain pointer)."""
    return tirx.call_intrin("handle", tirx.op.Op.get("tl.tma_store"), gmem_ptr, smem_ptr, T.uint32(nbytes), 0, 0)


@T.macro
def _transpose_words(w_in, w_out, elem_bytes: int):
    """``w_out[j, :]`` = column j of the ``VEC x VEC`` element block held row-wise in ``w_in``."""
    if elem_bytes == 4:
        for j in T.unroll(4):
            for m in T.unroll(4):
                w_out[j, m] = w_in[m, j]
    elif elem_bytes == 2:
        # out row 2w+h, word m = half h of word w of x rows 2m and 2m+1
        for w in T.unroll(4):
            for m in T.unroll(4):
                w_out[2 * w, m] = _perm(w_in[2 * m, w], w_in[2 * m + 1, w], 0x5410)
                w_out[2 * w + 1, m] = _perm(w_in[2 * m, w], w_in[2 * m + 1, w], 0x7632)
    else:
        # out row 4w+t, word m = byte t of word w of x rows 4m..4m+3
        for w in T.unroll(4):
            for m in T.unroll(4):
                lo01 = _perm(w_in[4 * m, w], w_in[4 * m + 1, w], 0x5140)  # a0 b0 a1 b1
                hi01 = _perm(w_in[4 * m, w], w_in[4 * m + 1, w], 0x7362)  # a2 b2 a3 b3
                lo23 = _perm(w_in[4 * m + 2, w], w_in[4 * m + 3, w], 0x5140)
                hi23 = _perm(w_in[4 * m + 2, w], w_in[4 * m + 3, w], 0x7362)
                w_out[4 * w, m] = _perm(lo01, lo23, 0x5410)
                w_out[4 * w + 1, m] = _perm(lo01, lo23, 0x7632)
                w_out[4 * w + 2, m] = _perm(hi01, hi23, 0x5410)
                w_out[4 * w + 3, m] = _perm(hi01, hi23, 0x7632)


@T.macro
def _elementwise(x, out, bb, r0, c0, nr: int, nc: int, rows, cols):
    """``out[bb, c, r] = x[bb, r, c]`` for the ``nr x nc`` block at ``(r0, c0)``, bounds-checked
    (``out[c, r] = x[r, c]`` for 2-D buffers: the direct kernel's rank-2 variant)."""
    for i in T.serial(nr):
        for j in T.serial(nc):
            if r0 + i < rows and c0 + j < cols:
                if len(x.shape) == 2:
                    out[c0 + j, r0 + i] = x[r0 + i, c0 + j]
                else:
                    out[bb, c0 + j, r0 + i] = x[bb, r0 + i, c0 + j]


@T.macro
def _load_block(x, xw_shape, w_in, bb, rv, cv, vec: int, rows, cols, check: bool):
    """``w_in[i, :]`` = the 16-byte vector ``cv`` of row ``rv * vec + i`` of x (zeros past the end)."""
    for i in T.unroll(vec):
        if not check or (rv * vec + i < rows and cv < cols // vec):
            for k in T.vectorized(4):
                w_in[i, k] = _view(x, xw_shape, "uint32")[bb, rv * vec + i, cv * 4 + k]
        else:
            for k in T.unroll(4):
                w_in[i, k] = T.uint32(0)


def batched_transpose(dtype: str, small: bool, rank: int = 3):
    """Build the PrimFunc for one dtype (torch naming) and tile size.  ``rank=2``
    (``transpose.transpose_tiled``): x ``[rows, cols]`` and out ``[cols, rows]``, one batch (the op
    then passes a 2-D x as it is, without a ``[1, rows, cols]`` view per call)."""
    if dtype not in _DTYPES:
        raise ValueError(f"batched_transpose: dtype must be one of {sorted(_DTYPES)} (got {dtype!r})")
    return tiled_transpose(dtype, *_WARPS[small], _MIN_BLOCKS[_DTYPES[dtype][1]] * (4 if small else 1), rank)


def transpose_tiled(dtype: str, small: bool):
    """:func:`batched_transpose` of 2-D x ``[rows, cols]`` and out ``[cols, rows]``."""
    return batched_transpose(dtype, small, rank=2)


def tiled_transpose(dtype: str, warps_r: int, warps_c: int, min_blocks: int, rank: int = 3):
    """The PrimFunc of ``warps_r x warps_c`` warps per block (tile ``warps_r * 8 * VEC`` rows x
    ``warps_c * 4 * VEC`` columns) and ``min_blocks`` resident blocks per SM (caps registers);
    x and out of ``rank`` 3 (batched) or 2 (one batch)."""
    if rank not in (2, 3):
        raise ValueError(f"tiled_transpose: rank must be 2 or 3 (got {rank!r})")
    tl_dtype, elem_bytes = _DTYPES[dtype]
    vec = 16 // elem_bytes
    blocks_r, blocks_c = warps_r * LANES_R, warps_c * LANES_C  # thread blocks per tile
    tile_r, tile_c = blocks_r * vec, blocks_c * vec
    threads = 32 * warps_r * warps_c
    seg_words = tile_r * elem_bytes // 4  # one staged out row: the tile's rows of x, in words
    per_word = 4 // elem_bytes
    int_dtype = _INT_OF_SIZE[elem_bytes]
    batch, rows, cols, xw_shape, ow_shape = word_shapes(vec)
    if rank == 2:  # one batch: the word views keep their leading 1
        batch, xw_shape, ow_shape = 1, (1, *xw_shape[1:]), (1, *ow_shape[1:])

    @T.prim_func
    def main(
        x: T.Tensor((batch, rows, cols)[3 - rank:], tl_dtype),
        out: T.Tensor((batch, cols, rows)[3 - rank:], tl_dtype),
    ):
        with T.Kernel(T.ceildiv(rows, tile_r), T.ceildiv(cols, tile_c), batch, threads=threads) as (br, bc, bb):
            T.annotate_min_blocks_per_sm(min_blocks)
            tid = T.get_thread_binding()
            stage = T.alloc_shared((tile_c, seg_words), "uint32")  # the out tile, row-major
            w_in = T.alloc_local((vec, 4), "uint32")  # w_in[i, :] = x[r + i, c : c + vec]
            w_out = T.alloc_local((vec, 4), "uint32")  # w_out[j, :] = out[c + j, r : r + vec]
            warp = tid // 32
            lane = tid % 32
            rl = (warp // warps_c) * LANES_R + lane % LANES_R  # row block within the tile
            cl = (warp % warps_c) * LANES_C + lane // LANES_R  # column vector within the tile
            rv = br * blocks_r + rl  # r // vec
            cv = bc * blocks_c + cl  # c // vec
            aligned = rows % vec == 0 and cols % vec == 0
            full = (br + 1) * tile_r <= rows and (bc + 1) * tile_c <= cols
            if aligned:
                if full:
                    _load_block(x, xw_shape, w_in, bb, rv, cv, vec, rows, cols, False)
                else:
                    _load_block(x, xw_shape, w_in, bb, rv, cv, vec, rows, cols, True)
                _transpose_words(w_in, w_out, elem_bytes)
                for j in T.unroll(vec):
                    for k in T.vectorized(4):
                        stage[cl * vec + j, rl * 4 + k] = w_out[j, k]
                T.fence_proxy_async()  # make the generic-proxy writes visible to the bulk copy
                T.sync_threads()
                # the valid bytes of each out row of this tile: a multiple of 16 (rows % vec == 0)
                seg_bytes = T.min(tile_r, rows - br * tile_r) * elem_bytes
                for t in T.serial(T.ceildiv(tile_c, threads)):
                    if t * threads + tid < tile_c and bc * tile_c + t * threads + tid < cols:
                        _bulk_store(
                            T.address_of(_view(out, ow_shape, "uint32")[bb, bc * tile_c + t * threads + tid, br * seg_words]),
                            T.address_of(stage[t * threads + tid, 0]),
                            T.Cast("uint32", seg_bytes),
                        )
                        T.tma_store_arrive()
                        T.tma_store_wait(0)  # shared memory must stay until the copy has read it
            elif cols % vec == 0:
                # Rows of x are aligned, rows of out are not (rows % vec != 0): vector loads, the
                # same staging, then element stores along out rows.
                if cv < cols // vec:
                    _load_block(x, xw_shape, w_in, bb, rv, cv, vec, rows, cols, True)
                    _transpose_words(w_in, w_out, elem_bytes)
                    for j in T.unroll(vec):
                        for k in T.vectorized(4):
                            stage[cl * vec + j, rl * 4 + k] = w_out[j, k]
                T.sync_threads()
                for it in T.serial(tile_c * tile_r // threads):
                    t = (it * threads + tid) // tile_r  # out row within the tile
                    e = (it * threads + tid) % tile_r  # element within that row
                    if bc * tile_c + t < cols and br * tile_r + e < rows:
                        _view(out, (batch, cols, rows), int_dtype)[bb, bc * tile_c + t, br * tile_r + e] = T.Cast(
                            int_dtype, stage[t, e // per_word] >> T.Cast("uint32", (e % per_word) * (8 * elem_bytes))
                        )
            else:
                _elementwise(x, out, bb, rv * vec, cv * vec, vec, vec, rows, cols)

    return main


KERNELS = (
    KernelDecl(
        name="transpose.batched_transpose",
        factory=batched_transpose,
        grid=tuple({"dtype": d, "small": s} for d in ("bfloat16", "float32", "float8_e4m3fn") for s in (False, True)),
        outputs=("out",),
        doc="out[b] = x[b].T; x [batch, rows, cols], out [batch, cols, rows], contiguous; small: 2-warp tiles.",
    ),
    KernelDecl(
        name="transpose.transpose_tiled",
        factory=transpose_tiled,
        grid=tuple({"dtype": d, "small": s} for d in ("bfloat16", "float32", "float8_e4m3fn") for s in (False, True)),
        outputs=("out",),
        doc="out = x.T (2-D): batched_transpose's kernel with one batch; x [rows, cols], out [cols, rows].",
    ),
)

__all__ = ["KERNELS", "batched_transpose", "tiled_transpose", "transpose_tiled", "word_shapes"]
