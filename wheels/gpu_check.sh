#!/usr/bin/env bash
# The one script for the lent H200: install the built wheel OUTSIDE the checkout, run the GPU
# test suite against it, run the benchmarks, and run compute-sanitizer on small launches.
#
#   device tool:  command "bash wheels/gpu_check.sh", carry ["wheels/dist"]
#   locally:      OUT=/some/dir bash wheels/gpu_check.sh     (OUT defaults to bench-results/tmp)
#
# Environment:
#   GPU_CHECK_STAGES       stages to run, default "tests fuzz bench sanitizer" (env facts +
#                          install always run); e.g. GPU_CHECK_STAGES="bench"; also "multigpu"
#                          (wheels/multi_gpu_procs.py: one process per GPU, NCCL + the smoke tests)
#   GPU_CHECK_FUZZ_CALLS   calls of the GPU fuzz (wheels/fuzz_ops.py), default 10000; under
#                          compute-sanitizer memcheck: GPU_CHECK_FUZZ_SANITIZER_CALLS, default 3000
#   GPU_CHECK_FUZZ_SEED    its seed, default 1 (the sanitizer run uses seed + 1)
#   GPU_CHECK_FUZZ_MHC_CALLS  calls of the second fuzz run, of the mHC ops only (--families mhc), default 2000
#   GPU_CHECK_PYTEST_ARGS  extra pytest arguments (split on spaces), e.g. "-x --maxfail=20"
#   GPU_CHECK_TESTS_S      seconds the test stage may take at most, default 300
#   GPU_CHECK_PYTEST_K     a pytest -k expression (may contain spaces), e.g. "quant or unchecked"
#   GPU_CHECK_BUDGET_S     wall-clock budget for the whole script, default 540 (the device
#                          tool stops a command at 600 s); a stage gets what is left, minus a reserve
#   GPU_CHECK_PYTHON       interpreter, default python3 (the image's torch Python)
#   GPU_CHECK_BENCHES      benchmarks to run, default "quant moe engram mhc op_host launch transpose host_parts";
#                          also "compare_peer" (bench/compare_peer.py: tilebin vs tile_kernels side by side,
#                          per family in its own process; writes bench-compare-peer.json); its extra
#                          arguments: GPU_CHECK_COMPARE_ARGS, e.g. "--quick --families moe"
#                          and "op_budget" (bench/bench_op_budget.py: every tilebin.ops op's host us at 4
#                          tokens against issue 10's budget, torch.add + one torch.empty per output)
#   GPU_CHECK_PEER_TAR     a .tar.xz of tile_kernels + tilelang unpacked (../shared/NOTES.md), default
#                          $REPO/.tk/tk.tar.xz when present: the benches that know the peer
#                          (engram) time it side by side
#   GPU_CHECK_QUANT_ARGS   extra arguments of bench_quant.py, e.g. "--quick"
#   GPU_CHECK_ENGRAM_ARGS, GPU_CHECK_MHC_ARGS, GPU_CHECK_MOE_ARGS  extra arguments of bench_engram.py /
#                          bench_mhc.py / bench_moe.py, e.g.
#                          "--candidate" (adds the rows of a kernel candidate beside the current one)
#   GPU_CHECK_TRANSPOSE_ARGS  extra arguments of bench_transpose.py, e.g. "--cand KERNEL --only bfloat16"
#   GPU_CHECK_BASELINE_WHEEL  another tilebin wheel (e.g. main before a change): the host_ab bench
#                          times eager host cost per op call of both, side by side (GPU_CHECK_AB_ROUNDS
#                          ABBA rounds, default 6)
#
# Files written under $OUT (flat, 8 at most, as the device tool returns them):
#   summary.txt          timestamps, stage exit codes, environment (nvidia-smi, versions, wheel)
#   gpu-tests.log        pytest output
#   bench.log            the benchmarks' output   bench.md        their markdown tables
#   bench-quant.json     tilebin.ops.quant device time, GB/s, % of copy_, host us per call
#   bench-moe.json       tilebin.ops.moe host us at decode sizes, device time and GB/s at prefill
#   fuzz.log             the GPU fuzz's counts (JSON: calls, refused, untyped, mismatch, fault...)
#   fuzz-mhc.log         the same for the mHC ops (--families mhc)
#   sanitizer.log        compute-sanitizer memcheck + racecheck, and memcheck over fuzzed calls
# Exit status: 0 when every stage that ran passed, 1 otherwise, 2 when the wheel is missing.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$REPO/bench-results/tmp}"
mkdir -p "$OUT"
STAGES=" ${GPU_CHECK_STAGES:-tests fuzz bench sanitizer} "
BUDGET="${GPU_CHECK_BUDGET_S:-540}"
PY="${GPU_CHECK_PYTHON:-python3}"
SITE=/tmp/tb-site
SUMMARY="$OUT/summary.txt"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export TB_PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS
declare -A RC=()
: >"$SUMMARY"

stamp() { printf '[gpu_check %s +%4ss] %s\n' "$(date -u +%H:%M:%S)" "$((SECONDS - T0))" "$*" | tee -a "$SUMMARY"; }
wants() { [[ "$STAGES" == *" $1 "* ]]; }
# seconds a stage may take: its own cap, or what is left of the budget minus a reserve
limit() {
  local left=$((BUDGET - (SECONDS - T0) - ${2:-20}))
  ((left < $1)) && echo "$left" || echo "$1"
}
# run in /tmp with the installed wheel first on the path
in_tmp() { (cd /tmp && PYTHONPATH="$TB_PYTHONPATH" TILEBIN_EXPECT_INSTALLED=1 "$@"); }

record_env() {
  stamp "environment (stages:$STAGES budget ${BUDGET}s)"
  {
    echo "== date: $(date -u +%FT%TZ)  host: $(hostname)  kernel: $(uname -r)"
    echo "== repo: $REPO  (the copy's git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo n/a); it can lag)"
    echo "== wheel source: $(cat "$REPO/wheels/dist/BUILD_SOURCE" 2>/dev/null || echo "not recorded (a wheel from before build.sh wrote BUILD_SOURCE)")"
    echo "== nvidia-smi"; nvidia-smi 2>&1
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,pstate \
      --format=csv 2>&1
    echo "== python/torch/cuda-bindings"
    "$PY" - <<'EOF' 2>&1
import importlib.metadata as md, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "cuda-bindings", "cuda-core", "numpy", "pytest", "pytest-timeout"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
import torch
print("torch.version.cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "sm", f"{p.major}.{p.minor}", "SMs", p.multi_processor_count,
          "L2", getattr(p, "L2_cache_size", "?"), "mem", p.total_memory)
EOF
    echo "== nvcc: $(nvcc --version 2>&1 | tail -1)"
    echo "== compute-sanitizer: $(compute-sanitizer --version 2>&1 | tail -1)"
    echo "== wheels/dist"; ls -la "$REPO"/wheels/dist 2>&1; sha256sum "$REPO"/wheels/dist/*.whl 2>&1
  } >>"$SUMMARY" 2>&1
}

install_wheel() {
  shopt -s nullglob
  local wheels=("$REPO"/wheels/dist/tilebin-*.whl)
  shopt -u nullglob
  if ((${#wheels[@]} == 0)); then
    stamp "FATAL: no wheels/dist/tilebin-*.whl (did the device call carry wheels/dist?)"
    return 2
  fi
  WHEEL="$(ls -t "${wheels[@]}" | head -1)"
  ((${#wheels[@]} > 1)) && stamp "WARNING: ${#wheels[@]} wheels in wheels/dist; using the newest"
  stamp "installing $(basename "$WHEEL") into $SITE"
  rm -rf "$SITE"
  "$PY" -m pip install --no-deps --no-index --no-compile --disable-pip-version-check -q \
    --target "$SITE" "$WHEEL" >>"$SUMMARY" 2>&1 || { stamp "FATAL: pip install failed"; return 2; }
  # byte-compile the runtime as a normal `pip install` does (the import timings assume .pyc files);
  # kernels/ and aot/ need tilelang and are never imported here
  "$PY" -m compileall -q "$SITE/tilebin/__init__.py" "$SITE/tilebin/runtime" "$SITE/tilebin/ops" >>"$SUMMARY" 2>&1 \
    || stamp "WARNING: compileall failed; import timings include compiling the sources"
  in_tmp "$PY" - 2>&1 <<'EOF' | tee -a "$SUMMARY"
import json, importlib.resources, tilebin
from tilebin import runtime
art = importlib.resources.files("tilebin") / "_artifacts"
print("tilebin", tilebin.__version__, tilebin.__file__)
print("runtime", runtime.__file__)
print("kernels", runtime.kernel_names())
print("build", json.loads((art / "manifest.json").read_text()).get("build"))
EOF
  local rc=$?
  # which hot path runs, and whether it reads torch tensors through torch's C shim (csrc/_hot_tensor.h)
  in_tmp "$PY" -m tilebin doctor 2>&1 | grep -E "hot path|torch " | tee -a "$SUMMARY"
  stamp "smoke import of the installed wheel: rc=$rc"
  return $rc
}

run_tests() {
  local cap
  local reserve=150  # for the stages after this one; none when tests run alone
  [[ "$STAGES" == " tests " ]] && reserve=15
  [[ "$STAGES" == " tests fuzz " ]] && reserve=200
  cap=$(limit "${GPU_CHECK_TESTS_S:-300}" "$reserve")
  if ((cap < 30)); then  # (a negative cap once reached `timeout` as an option: the suite silently never ran)
    stamp "tests: skipped, only ${cap}s left in the budget after ${reserve}s kept for later stages; raise GPU_CHECK_BUDGET_S"
    RC[tests]=1
    return
  fi
  stamp "tests: pytest tests/gpu (limit ${cap}s)"
  printf '[pytest]\nmarkers =\n    gpu: needs an NVIDIA sm_90 GPU\n' >/tmp/tb-pytest.ini
  local extra=()
  "$PY" -c "import pytest_timeout" 2>/dev/null && extra+=(--timeout=150 --timeout-method=thread)
  [[ -n "${GPU_CHECK_PYTEST_K:-}" ]] && extra+=(-k "$GPU_CHECK_PYTEST_K" --continue-on-collection-errors)
  # -c/--rootdir/--confcutdir: neither the repo's pytest config nor tests/conftest.py (which
  # maps the source tree onto `tilebin`) applies; the suite sees the installed wheel only.
  # shellcheck disable=SC2086
  in_tmp timeout -k 10 "$cap" "$PY" -m pytest "$REPO/tests/gpu" -q -rfEsx -p no:cacheprovider \
    -c /tmp/tb-pytest.ini --rootdir "$REPO/tests/gpu" --confcutdir "$REPO/tests/gpu" \
    --durations=15 --tb=short "${extra[@]}" ${GPU_CHECK_PYTEST_ARGS:-} \
    2>&1 | tee "$OUT/gpu-tests.log"
  RC[tests]=$?
  stamp "tests: rc=${RC[tests]}  $(grep -E '(passed|failed|error|skipped)' "$OUT/gpu-tests.log" | tail -1)"
}

# The example project (examples/my_kernels): its own wheel, with its own cubins, installed beside
# tilebin's and tested from /tmp with TileLang and TVM blocked (its tests/conftest.py). Runs in the
# tests stage when examples/my_kernels/dist/*.whl was carried (build it with examples/my_kernels/build.sh).
run_example_tests() {
  shopt -s nullglob
  local wheels=("$REPO"/examples/my_kernels/dist/my_kernels-*.whl)
  shopt -u nullglob
  if ((${#wheels[@]} == 0)); then
    stamp "example: no examples/my_kernels/dist/*.whl carried; skipped"
    return 0
  fi
  local site=/tmp/tb-example-site work=/tmp/tb-example
  rm -rf "$site" "$work" && mkdir -p "$work"
  "$PY" -m pip install --no-deps --no-index -q --target "$site" "$WHEEL" "${wheels[0]}" >>"$SUMMARY" 2>&1 \
    || { stamp "example: pip install failed"; RC[example]=1; return; }
  cp -r "$REPO/examples/my_kernels/tests" "$work/tests"
  (cd "$work" && PYTHONPATH="$site" timeout -k 10 120 "$PY" -m pytest tests -q -rfEs -p no:cacheprovider \
     >"$OUT/example-tests.log" 2>&1)
  RC[example]=$?
  tail -n 30 "$OUT/example-tests.log"
  stamp "example: rc=${RC[example]}  $(grep -E '(passed|failed|error)' "$OUT/example-tests.log" | tail -1)"
}

bench_one() {  # bench_one NAME CAP_S ARGS...: run bench/bench_NAME.py if GPU_CHECK_BENCHES lists it
  local name=$1 want=$2 cap
  shift 2
  [[ " ${GPU_CHECK_BENCHES:-quant moe engram mhc op_host launch transpose host_parts} " == *" $name "* ]] || return 0
  cap=$(limit "$want" 60)
  if ((cap < 30)); then
    stamp "bench: $name skipped, only ${cap}s left in the budget"
    RC[bench_$name]=1
    return
  fi
  stamp "bench: bench_$name.py (limit ${cap}s)"
  local tbpath="$TB_PYTHONPATH" script="$REPO/bench/bench_$name.py"
  [[ -f "$script" ]] || script="$REPO/bench/$name.py"  # compare_peer.py
  [[ -n "${PEER_PATH:-}" && ($name == engram || $name == mhc || $name == compare_peer) ]] && tbpath="$TB_PYTHONPATH:$PEER_PATH"
  (cd /tmp && PYTHONPATH="$tbpath" TILEBIN_EXPECT_INSTALLED=1 timeout -k 10 "$cap" "$PY" "$script" \
    "$@" --md "$OUT/bench.md") 2>&1 | tee -a "$OUT/bench.log"
  RC[bench_$name]=$?
}

unpack_peer() {  # tile_kernels + tilelang for side-by-side rows, when a tarball came along
  local tar="${GPU_CHECK_PEER_TAR:-$REPO/.tk/tk.tar.xz}"
  [[ -f "$tar" ]] || return 0
  stamp "bench: unpacking the peer (tile_kernels) from $tar"
  mkdir -p /tmp/tb-peer && tar -xJf "$tar" -C /tmp/tb-peer && PEER_PATH="$(ls -d /tmp/tb-peer/*/ | head -1)"
  stamp "bench: peer on $PEER_PATH"
}

run_bench() {
  rm -f "$OUT/bench.md"
  unpack_peer
  bench_one compare_peer 420 --json "$OUT/bench-compare-peer.json" ${GPU_CHECK_COMPARE_ARGS:-}
  bench_one engram 200 ${GPU_CHECK_ENGRAM_ARGS:-}
  bench_one mhc 240 ${GPU_CHECK_MHC_ARGS:-}
  if [[ -n "${GPU_CHECK_BASELINE_WHEEL:-}" ]]; then
    rm -rf /tmp/tb-base && "$PY" -m pip install -q --no-deps --target /tmp/tb-base "$GPU_CHECK_BASELINE_WHEEL" \
      >/dev/null 2>&1 && bench_one host_ab 200 --site "before=/tmp/tb-base" --site "after=$SITE" \
      --rounds "${GPU_CHECK_AB_ROUNDS:-6}"
  fi
  bench_one quant 240 --json "$OUT/bench-quant.json" ${GPU_CHECK_QUANT_ARGS:-}
  bench_one moe 150 --json "$OUT/bench-moe.json" ${GPU_CHECK_MOE_ARGS:-}
  bench_one op_host 90 --profile
  bench_one op_budget 120
  bench_one launch 150
  bench_one transpose 150 ${GPU_CHECK_TRANSPOSE_ARGS:-}
  bench_one host_parts 60
  local k summary=""
  for k in "${!RC[@]}"; do [[ $k == bench_* ]] && summary+=" ${k#bench_}=${RC[$k]}"; done
  stamp "bench: rc${summary}"
}

run_fuzz() {
  # reserve: for the stages after this one, at most half of what is left (a fixed 200 s left the
  # fuzz 2 s of a 325 s budget once); they cap themselves with what remains
  local cap reserve=10 left=$((BUDGET - (SECONDS - T0)))
  if [[ "$STAGES" == *" bench "* || "$STAGES" == *" sanitizer "* ]]; then
    reserve=$((left / 2 < 200 ? left / 2 : 200))
  fi
  cap=$(limit 240 "$reserve")
  if ((cap < 30)); then
    stamp "fuzz: skipped, only ${cap}s left in the budget; raise GPU_CHECK_BUDGET_S"
    RC[fuzz]=1
    return
  fi
  stamp "fuzz: wheels/fuzz_ops.py --calls ${GPU_CHECK_FUZZ_CALLS:-10000} --seed ${GPU_CHECK_FUZZ_SEED:-1} (limit ${cap}s)"
  in_tmp timeout -k 10 "$cap" "$PY" "$REPO/wheels/fuzz_ops.py" --calls "${GPU_CHECK_FUZZ_CALLS:-10000}" \
    --seed "${GPU_CHECK_FUZZ_SEED:-1}" --max-seconds $((cap - 20)) 2>&1 | tee "$OUT/fuzz.log"
  RC[fuzz]=$?
  # the mHC ops (tilebin.modeling.mhc.ops' OpSpec ops), their own run
  cap=$(limit 120 "$reserve")
  stamp "fuzz: wheels/fuzz_ops.py --families mhc --calls ${GPU_CHECK_FUZZ_MHC_CALLS:-2000} (limit ${cap}s)"
  in_tmp timeout -k 10 "$cap" "$PY" "$REPO/wheels/fuzz_ops.py" --families mhc --calls "${GPU_CHECK_FUZZ_MHC_CALLS:-2000}" \
    --seed "${GPU_CHECK_FUZZ_SEED:-1}" --max-seconds $((cap - 20)) 2>&1 | tee "$OUT/fuzz-mhc.log"
  local rc_mhc=$?
  [[ ${RC[fuzz]} -eq 0 ]] && RC[fuzz]=$rc_mhc
  stamp "fuzz: rc=${RC[fuzz]} (1 = untyped errors, mismatches, refused valid calls or a fault; 124 = timeout)"
}

write_sanitize_script() {
  cat >/tmp/tb_sanitize.py <<'EOF'
"""Small launches of every shipped kernel, checked; run under compute-sanitizer."""
import os, sys
sys.path.insert(0, os.environ["TB_GPU_TESTS"])
import torch
from tilebin import runtime as rt
from _cases import make_case
from _gpu_util import Rng

bad = 0
for kind in sys.argv[1].split(","):
    try:
        case = make_case(kind, Rng("sanitizer/" + kind), rt)
        case.poison()
        case.launch(rt)
        torch.cuda.synchronize()
        case.check("under compute-sanitizer")
        print("OK", kind, case, flush=True)
    except Exception as exc:
        bad += 1
        print("FAILED", kind, repr(exc)[:2000], flush=True)
sys.exit(1 if bad else 0)
EOF
}

run_sanitizer() {
  local cs
  cs="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
  if [[ -z "$cs" ]]; then
    stamp "sanitizer: compute-sanitizer not found; skipped"
    RC[sanitizer]=0
    return
  fi
  write_sanitize_script
  local mem="transpose_bf16,transpose_f32,transpose_fp8,transpose_warps_bf16,transpose_warps_fp8,gemm_small,gemm_large,coop_sum,pdl_chain"
  local race="${GPU_CHECK_RACECHECK_KINDS:-transpose_bf16,transpose_fp8,transpose_warps_bf16,transpose_warps_fp8,coop_sum}"
  local cap tool kinds rc all=0
  for spec in "memcheck:$mem" "racecheck:$race"; do
    tool="${spec%%:*}" kinds="${spec#*:}"
    cap=$(limit 180 10)
    if ((cap < 30)); then
      stamp "sanitizer: $tool skipped, ${cap}s left in the budget"
      all=1
      continue
    fi
    stamp "sanitizer: $tool on $kinds (limit ${cap}s)"
    in_tmp env TB_GPU_TESTS="$REPO/tests/gpu" PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$cap" \
      "$cs" --tool "$tool" --error-exitcode 3 --print-limit 30 --report-api-errors no \
      "$PY" /tmp/tb_sanitize.py "$kinds" 2>&1 | tee -a "$OUT/sanitizer.log"
    rc=$?
    stamp "sanitizer: $tool rc=$rc (3 = the tool found errors, 1 = a wrong result, 124 = timeout)"
    ((rc != 0)) && all=1
  done
  # the op layer: odd token counts, partial tiles and scale groups of every op
  cap=$(limit 200 10)
  if ((cap < 30)); then
    stamp "sanitizer: ops memcheck skipped, ${cap}s left in the budget"
    all=1
  else
    stamp "sanitizer: memcheck on wheels/sanitize_ops.py ${GPU_CHECK_SANITIZE_OPS:-all} (limit ${cap}s)"
    in_tmp env PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$cap" \
      "$cs" --tool memcheck --error-exitcode 3 --print-limit 30 --report-api-errors no \
      "$PY" "$REPO/wheels/sanitize_ops.py" "${GPU_CHECK_SANITIZE_OPS:-all}" 2>&1 | tee -a "$OUT/sanitizer.log"
    rc=$?
    stamp "sanitizer: ops memcheck rc=$rc"
    ((rc != 0)) && all=1
  fi
  # fuzzed calls (mostly bad or edge-case arguments) under memcheck
  cap=$(limit 200 10)
  if ((cap < 30)); then
    stamp "sanitizer: fuzz memcheck skipped, ${cap}s left in the budget"
    all=1
  else
    local n=${GPU_CHECK_FUZZ_SANITIZER_CALLS:-3000} seed=$((${GPU_CHECK_FUZZ_SEED:-1} + 1))
    stamp "sanitizer: memcheck on wheels/fuzz_ops.py --calls $n --seed $seed (limit ${cap}s)"
    in_tmp env PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$cap" \
      "$cs" --tool memcheck --error-exitcode 3 --print-limit 30 --report-api-errors no \
      "$PY" "$REPO/wheels/fuzz_ops.py" --calls "$n" --seed "$seed" --big-share 0 --max-seconds $((cap - 30)) \
      2>&1 | tee -a "$OUT/sanitizer.log"
    rc=$?
    stamp "sanitizer: fuzz memcheck rc=$rc"
    ((rc != 0)) && all=1
  fi
  RC[sanitizer]=$all
}

# One process per GPU beside torch.distributed (NCCL): wheels/multi_gpu_procs.py. With one GPU it
# runs a world of one (the same code); issue 15's two-GPU run needs the nvidia-h200-x2 kind.
run_multigpu() {
  local cap
  cap=$(limit 420 10)
  stamp "multigpu: wheels/multi_gpu_procs.py on $("$PY" -c 'import torch; print(torch.cuda.device_count())') GPU(s) (limit ${cap}s)"
  in_tmp env NCCL_NVLS_ENABLE=0 timeout -k 10 "$cap" "$PY" "$REPO/wheels/multi_gpu_procs.py" 2>&1 \
    | tee "$OUT/multigpu.log" | grep -E "^multi_gpu_procs|passed|failed"
  RC[multigpu]=${PIPESTATUS[0]}
  stamp "multigpu: rc=${RC[multigpu]}"
}

main() {
  record_env
  install_wheel
  local rc=$?
  if ((rc != 0)); then
    stamp "stopping: the wheel is not installed (rc=$rc); see $SUMMARY"
    return 2
  fi
  wants tests && run_tests
  wants tests && run_example_tests
  wants fuzz && run_fuzz
  wants bench && run_bench
  wants sanitizer && run_sanitizer
  wants multigpu && run_multigpu
  local status=0 k
  for k in "${!RC[@]}"; do
    stamp "stage $k: rc=${RC[$k]}"
    ((RC[$k] != 0)) && status=1
  done
  [[ -f "$OUT/bench.md" ]] && cat "$OUT/bench.md"
  stamp "done: status=$status, files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return $status
}

main
exit $?
