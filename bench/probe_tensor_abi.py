#!/usr/bin/env python3
"""What an op's per-call tensor reads cost through torch's Python accessors, and through its C++ API.

    python3 bench/probe_tensor_abi.py [--md F] [--json F] [--build-dir D]

Issue 10's last ops over budget spend their host time in torch's Python accessors: per tensor
an op's memo key reads ``dtype``, ``is_cuda`` and ``shape``, its per-call checks
``is_contiguous()`` and ``data_ptr()``.  The wheel may not use torch's C++ API (the issue asks
for an abi3 extension without torch headers), so this benchmark measures what that rule costs:
it compiles ``tensor_abi_probe.cpp`` here, against the torch of this machine (g++ and torch's
headers; not part of the wheel), and times, for 1 to 13 CUDA tensors (CPU tensors without a
GPU):

* python: one generated function reading those five facts of every tensor into a tuple (the
  op's own reads, no key hashing or lookup);
* c++: ``facts(*tensors)``, the same facts (and every size and stride) through ``at::Tensor``;
* c++ call only: ``noop(*tensors)``, the same call reading nothing.

``timeit`` minimum of 9 repeats, ns per call.  Exit 0 with one line when the module cannot be
built (no compiler or headers): the table is then absent, never guessed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import timeit
from pathlib import Path

from _common import env_facts, env_markdown, markdown_table, write_reports

COUNTS = (1, 2, 3, 5, 9, 13)
SOURCE = Path(__file__).with_name("tensor_abi_probe.cpp")


def build(build_dir: Path):
    """Compile and import tensor_abi_probe against this torch; the module, or an error text."""
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = build_dir / f"tensor_abi_probe{suffix}"
    libs = library_paths()[0]
    cmd = ["g++", "-O2", "-std=c++17", "-shared", "-fPIC", str(SOURCE), "-o", str(target),
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           f"-I{sysconfig.get_paths()['include']}", *(f"-I{p}" for p in include_paths()),
           f"-L{libs}", f"-Wl,-rpath,{libs}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"build failed: {exc}"
    if done.returncode:
        return f"build failed ({done.returncode}): {done.stderr.strip()[-800:]}"
    sys.path.insert(0, str(build_dir))
    import tensor_abi_probe

    return tensor_abi_probe


def python_reader(n: int):
    """``read(t0, ..., t{n-1})``: the five facts of each tensor, as an op's generated code reads them."""
    names = [f"t{i}" for i in range(n)]
    parts = ", ".join(f"{t}.dtype, {t}.is_cuda, {t}.shape, {t}.is_contiguous(), {t}.data_ptr()" for t in names)
    src = f"def read({', '.join(names)}):\n    return ({parts},)\n"
    env: dict = {}
    exec(compile(src, "<probe reader>", "exec"), env)  # noqa: S102 - source built above from fixed fragments
    return env["read"]


def ns_per_call(fn, args: tuple, number: int = 100_000) -> float:
    return min(timeit.repeat(lambda: fn(*args), number=number, repeat=9)) / number * 1e9


def rows(probe) -> list[list]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = [torch.empty(4, 7168, dtype=torch.bfloat16, device=device) for _ in range(max(COUNTS))]
    out = []
    for n in COUNTS:
        args = tuple(tensors[:n])
        assert probe.facts(*args) == probe.facts(*args)  # it runs, and reads the same facts twice
        py, cc, call = (ns_per_call(python_reader(n), args), ns_per_call(probe.facts, args),
                        ns_per_call(probe.noop, args))
        out.append([n, round(py), round(cc), round(call), round(py - cc), round((py - cc) / n)])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md")
    ap.add_argument("--json")
    ap.add_argument("--build-dir", help="where the module is compiled (default: a temporary directory)")
    a = ap.parse_args()
    build_dir = Path(a.build_dir or tempfile.mkdtemp(prefix="tensor_abi_probe_"))
    os.makedirs(build_dir, exist_ok=True)
    probe = build(build_dir)
    if isinstance(probe, str):
        print(f"probe_tensor_abi: {probe}")
        return 0
    facts = env_facts()
    headers = ["tensors", "python accessors (ns)", "c++ at::Tensor (ns)", "c++ call only (ns)", "saved (ns)",
               "saved per tensor (ns)"]
    table = rows(probe)
    md = "\n".join(["# Tensor reads: torch's Python accessors against its C++ API", "", env_markdown(facts), "",
                    markdown_table(headers, table), ""])
    print(md)
    write_reports({"env": facts, "headers": headers, "rows": table}, md, a.json, a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
