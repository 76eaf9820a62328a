#!/usr/bin/env python3
"""engram.grad_w_reduce at 4 tokens: its GPU time per call (calls queued behind a GPU sleep), and its
host time per call with the GPU idle at every call (a sync before each single timed call) against
batches of 50 (bench_op_budget's setting), torch.add beside it.  Where the GPU time per call is above
the host time, a batch's pace is the GPU's and the batch figure is not a host-only one.

    cd /tmp && PYTHONPATH=<site with the tilebin wheel> taskset -c 2 python3 <repo>/bench/grad_w_reduce_pace.py
"""
import time, statistics, torch
import tilebin.ops.engram as eg
T,HC,H=4,4,7168
bf=lambda *s: torch.randn(*s, device="cuda").bfloat16()
x,k,v,go,wh,we=bf(T,HC,H),bf(T,HC,H),bf(T,H),bf(T,HC,H),bf(HC,H),bf(HC,H)
wf=eg.fused_weight(wh,we)
stats=tuple(eg.engram_gate_fwd(x,k,v,wf,1e-20,1e-6)[1:])
gwp=eg.engram_gate_bwd(go,x,k,v,wf,*stats,1e-6)[3]
gh,ge=torch.zeros_like(wf),torch.zeros_like(wf)
f=lambda: eg.grad_w_reduce(gwp,wh,we,gh,ge)
add_x=torch.randn(T,H,device="cuda",dtype=torch.bfloat16); add_y=torch.empty_like(add_x)
add=lambda: torch.add(add_x,1,out=add_y)
for _ in range(100): f()
torch.cuda.synchronize()
s,e=torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(500): f()
e.record(); torch.cuda.synchronize()
# events around host-paced launches time the host's pace too: this is the slower of the two
print(f"GPU timeline per call, launches paced by the host (500 back to back): {s.elapsed_time(e)*1000/500:.2f} us")
torch.cuda._sleep(40_000_000)  # queue the calls first: the GPU then runs them with no gap
s.record()
for _ in range(100): f()
e.record(); torch.cuda.synchronize()
print(f"GPU time per call (100 calls queued behind a GPU sleep): {s.elapsed_time(e)*1000/100:.2f} us")
def single(fn, n=3000):
    ts=[]
    for _ in range(n):
        torch.cuda.synchronize(); t0=time.perf_counter(); fn(); ts.append(time.perf_counter()-t0)
    torch.cuda.synchronize(); return statistics.median(ts)*1e6
def batch(fn, b=50, n=60):
    ts=[]
    for _ in range(n):
        torch.cuda.synchronize(); t0=time.perf_counter()
        for _ in range(b): fn()
        ts.append((time.perf_counter()-t0)/b)
    torch.cuda.synchronize(); return statistics.median(ts)*1e6
for r in range(3):
    print(f"round {r}: grad_w_reduce single {single(f):.2f} us, batch50 {batch(f):.2f} us | add single {single(add):.2f}, batch50 {batch(add):.2f}")
