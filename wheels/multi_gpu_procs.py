#!/usr/bin/env python3
"""One process per GPU (issue 15): tilebin beside torch.distributed, run by ``wheels/gpu_check.sh``
(stage ``multigpu``) against the installed wheel.

    PYTHONPATH=<site with the tilebin wheel> python3 wheels/multi_gpu_procs.py [--world N] [--pytest-args ...]

Spawns ``--world`` processes (default: every visible GPU, at most 2; with one GPU a world of
one, the single-GPU run of the same code).  Rank r sees only GPU r (``CUDA_VISIBLE_DEVICES``)
and:

1. joins an NCCL process group (NVLink multicast off: ``NCCL_NVLS_ENABLE=0``);
2. quantizes its own bf16 tensor with ``tilebin.ops.quant.per_token_cast`` (e4m3, 1 x 128),
   all-gathers every rank's ``(data, sf)`` and checks each bit for bit against its own
   quantization of that rank's input (regenerated from the rank's seed), then all-reduces the
   dequantized fp32 tensors and checks the sum against the local one (two terms: exact);
3. runs the GPU suite's smoke subset (``SMOKE`` test files) with pytest on its GPU.

Prints one line per rank and exits non-zero when any rank failed or timed out.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_TESTS = os.path.join(os.path.dirname(HERE), "tests", "gpu")
SMOKE = ("test_gpu_unchecked.py", "test_gpu_coop_pdl.py", "test_gpu_ops_graphs.py", "test_gpu_threads.py")
ROWS, HIDDEN = 4001, 7168


def _inputs(rank: int, device: str):
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    return (torch.randn((ROWS, HIDDEN), generator=g) * (rank + 1)).bfloat16().to(device)


def _dequantized(data, sf):
    return data.float() * sf.repeat_interleave(128, dim=1)[:, : data.shape[1]]


def _collective_check(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    from tilebin.ops import quant

    data, sf = quant.per_token_cast(_inputs(rank, "cuda"), "e4m3", 128)
    datas = [torch.empty_like(data) for _ in range(world)]
    sfs = [torch.empty_like(sf) for _ in range(world)]
    dist.all_gather(datas, data)
    dist.all_gather(sfs, sf)
    for r in range(world):
        want_data, want_sf = quant.per_token_cast(_inputs(r, "cuda"), "e4m3", 128)
        if not (torch.equal(datas[r].view(torch.uint8), want_data.view(torch.uint8)) and torch.equal(sfs[r], want_sf)):
            raise AssertionError(f"rank {rank}: rank {r}'s gathered (data, sf) differ from a local quantization")
    total = _dequantized(data, sf)
    dist.all_reduce(total)
    want = sum(_dequantized(datas[r], sfs[r]) for r in range(world))
    if not torch.equal(total, want):
        raise AssertionError(f"rank {rank}: all_reduce of the dequantized tensors differs from the local sum")


def _rank_main(rank: int, world: int, port: int, pytest_args: list[str], results) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    try:
        import pytest
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", 0))
        _collective_check(rank, world)
        dist.barrier()
        dist.destroy_process_group()
        ini = f"/tmp/tb-multi-pytest-{rank}.ini"
        with open(ini, "w") as f:
            f.write("[pytest]\nmarkers =\n    gpu: needs an NVIDIA sm_90 GPU\n")
        files = [os.path.join(GPU_TESTS, name) for name in SMOKE]
        rc = pytest.main([*files, "-q", "-p", "no:cacheprovider", "-c", ini, "--rootdir", GPU_TESTS,
                          "--confcutdir", GPU_TESTS, *pytest_args])
        results[rank] = f"collectives ok; smoke pytest rc={int(rc)}" if rc == 0 else f"smoke pytest rc={int(rc)}"
    except Exception:  # noqa: BLE001 - reported by the parent
        results[rank] = "FAILED: " + traceback.format_exc()[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=0, help="processes (default: visible GPUs, at most 2)")
    ap.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[])
    ns = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        print("multi_gpu_procs: skipped, no CUDA device visible")
        return 0
    world = ns.world or min(visible, 2)
    if world > visible:
        print(f"multi_gpu_procs: --world {world} needs {world} GPUs; {visible} visible")
        return 2
    ctx = mp.get_context("spawn")
    results = ctx.Manager().dict()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, ns.pytest_args, results)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=400)
    ok = True
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            results[r] = "TIMEOUT after 400 s"
        line = results.get(r, f"no result (exit code {p.exitcode})")
        ok &= line.startswith("collectives ok") and p.exitcode == 0
        print(f"multi_gpu_procs: rank {r} of {world} (GPU {r}): {line}")
    print(f"multi_gpu_procs: {'PASSED' if ok else 'FAILED'} with {world} process(es) on {visible} visible GPU(s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
