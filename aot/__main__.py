"""CLI of the AOT build.  Also runnable as a file from a source checkout:

    python aot/__main__.py build --out build/artifacts            # every tilebin kernel
    python -m tilebin.aot build --out DIR mypkg.my_kernels         # any module exporting KERNELS
"""

from __future__ import annotations

import argparse
import pathlib
import sys

if __package__ in (None, ""):  # run as a file from a checkout: import the checkout's tilebin
    # (it maps runtime/, aot/, kernels/ under its name), not this folder's bare modules
    sys.path[0:1] = [str(pathlib.Path(__file__).resolve().parent.parent)]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tilebin.aot", description="Prebuild TileLang kernels into cubins + manifest.",
                                epilog='Building needs TileLang: pip install "tilebin[aot]" (--help does not).')
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="lower every declared variant and write DIR/manifest.json + DIR/cubins/")
    b.add_argument("modules", nargs="*", help="modules exporting KERNELS (default: all of tilebin.kernels)")
    b.add_argument("--out", required=True, type=pathlib.Path, help="artifacts folder to write")
    b.add_argument("--cache", type=pathlib.Path, default=None,
                   help="incremental build cache folder; a variant is reused while its kernel module's import "
                        "closure (outside site-packages), TileLang, nvcc and the flags are unchanged. A module "
                        "imported with a computed name (importlib.import_module(f'...')) is not seen: import it "
                        "statically")
    b.add_argument("--jobs", type=int, default=0, help="parallel workers (default: one per core)")
    b.add_argument("--lineinfo", action="store_true", help="keep -lineinfo in cubins (for profiling; ~2.5x bigger)")
    b.add_argument("--nvcc", default=None,
                   help="path of nvcc, or 'pip' (default: $TILEBIN_NVCC, else the pip CUDA toolchain in this venv, "
                        "else $CUDA_HOME, /usr/local/cuda, PATH)")
    b.add_argument("--allow-nvcc-mismatch", action="store_true", help="build with an nvcc other than the pinned release")
    b.add_argument("--allow-tilelang-mismatch", action="store_true",
                   help="build with a TileLang other than the release tilebin[aot] pins")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from tilebin.aot import AotError, BuildOptions, build
    from tilebin.kernels.modules import ALL_MODULES

    opts = BuildOptions(out_dir=args.out, cache_dir=args.cache, jobs=args.jobs, lineinfo=args.lineinfo,
                        nvcc=args.nvcc, allow_nvcc_mismatch=args.allow_nvcc_mismatch,
                        allow_tilelang_mismatch=args.allow_tilelang_mismatch)
    try:
        build(args.modules or list(ALL_MODULES), opts)
    except AotError as exc:
        print(error_line(exc), file=sys.stderr)
        return 1
    return 0


def error_line(exc: BaseException) -> str:
    """One ``tilebin.aot: error:`` line; a multi-line cause (TileLang's) keeps its first and last line,
    and an error whose details went to a log file (``log_path``) names that file."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
    text = " ... ".join(lines) if len(lines) <= 2 else f"{lines[0]} ... {lines[-1]} ({len(lines) - 2} lines omitted)"
    log_path = getattr(exc, "log_path", None)
    details = f" [TileLang output and traceback: {log_path}]" if log_path else ""
    return f"tilebin.aot: error: {text}{details}"


if __name__ == "__main__":
    sys.exit(main())
