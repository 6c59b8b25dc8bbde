"""A wheel cut to what the GPU scripts use, small enough to travel to the GPU host inside the 64
MiB working tree: transformers cut to the model families a benchmark builds (the 5.24 wheel is
13.5 MB compressed, 2.2 MB with moe_model.py's five families), CUTLASS's wheel to its headers and
Python (6.4 MB, 4.3 without the examples and tools the compile stage does not read).

    python3 benchmarks/slim_wheel.py WHEEL OUT_DIR [--models qwen3_moe,...] [--drop PREFIX ...] [--keep PREFIX ...]

`--models`: only these folders of `transformers/models/` are kept (with `auto`, which maps config
names to classes lazily: a folder left out fails only when its model is asked for). `--drop`:
files under these path prefixes are left out, but those under a `--keep` prefix. The RECORD
(hashes of every file) is written empty: pip installs the wheel without it. For the GPU scripts
(`benchmarks/gpu_env.sh`):

    python3 benchmarks/slim_wheel.py transformers-5.24.0-py3-none-any.whl .whl/transformers-new --models DEFAULT
    python3 benchmarks/slim_wheel.py nvidia_cutlass-4.2.0.0-py3-none-any.whl .whl \\
      --drop cutlass_library/source/examples/ --drop cutlass_library/source/tools/ \\
      --keep cutlass_library/source/tools/util/include/ --drop cutlass_cppgen/
    python3 benchmarks/slim_wheel.py sqlalchemy-2.1.9-cp312-...whl .whl --drop-compiled \\
      --drop sqlalchemy/testing/ --drop sqlalchemy/dialects/mysql/ --drop sqlalchemy/dialects/oracle/ \\
      --drop sqlalchemy/dialects/mssql/
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

FAMILIES = ("qwen3_moe", "deepseek_v2", "gpt_oss", "mixtral", "olmoe")
"""benchmarks/moe_model.py's families (the modules of its `FAMILIES` configs): `--models DEFAULT`."""
_MODELS = "transformers/models/"


def slim(wheel: Path, out_dir: Path, *, models: tuple[str, ...] | None = None, drop: tuple[str, ...] = (),
         keep: tuple[str, ...] = (), compiled: bool = False) -> Path:
    """Write `wheel` without the files the options leave out into `out_dir`, same file name;
    return its path. `compiled`: leave out the extension modules that have a Python source of
    the same module in the wheel (SQLAlchemy's Cython builds of its own pure-Python modules,
    which it imports where the extension is missing). Raises SystemExit naming a model folder the
    wheel does not have, or a cut that leaves nothing out (a prefix misspelt)."""
    with zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        sources = set(names)
        twins = {n for n in names if compiled and n.endswith(".so") and _module_source(n) in sources}
        if models is not None:
            present = {n.split("/")[2] for n in names if n.startswith(_MODELS) and n.count("/") >= 3}
            missing = sorted(set(models) - present)
            if missing:
                raise SystemExit(f"{wheel.name} has no model folders {', '.join(missing)}")
            wanted = {*models, "auto"}

        def kept(name: str) -> bool:
            if name in twins:
                return False
            if models is not None and name.startswith(_MODELS) and name.count("/") >= 3:
                return name.split("/")[2] in wanted
            return not name.startswith(drop) or name.startswith(keep)

        if all(kept(n) for n in names):
            raise SystemExit(f"{wheel.name}: the options leave nothing out")
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / wheel.name
        if target.resolve() == wheel.resolve():
            raise SystemExit(f"{target}: the output would overwrite its source")
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
            for info in source.infolist():
                if kept(info.filename):
                    out.writestr(info, b"" if info.filename.endswith(".dist-info/RECORD") else source.read(info))
    return target


def _module_source(extension: str) -> str:
    """The Python source of an extension module's path: "a/b/_m.cpython-312-x86_64-linux-gnu.so" -> "a/b/_m.py"."""
    folder, _, name = extension.rpartition("/")
    return f"{folder}/{name.split('.', 1)[0]}.py" if folder else f"{name.split('.', 1)[0]}.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--models", help="transformers' model folders to keep, comma-separated (DEFAULT: "
                        f"{','.join(FAMILIES)})")
    parser.add_argument("--drop", action="append", default=[], help="leave out files under this path prefix")
    parser.add_argument("--keep", action="append", default=[], help="but keep those under this prefix")
    parser.add_argument("--drop-compiled", action="store_true",
                        help="leave out extension modules whose Python source the wheel holds too")
    args = parser.parse_args(argv)
    if not zipfile.is_zipfile(args.wheel):
        raise SystemExit(f"{args.wheel}: not a wheel (zip) file")
    models = None if args.models is None else (
        FAMILIES if args.models == "DEFAULT" else tuple(m for m in args.models.split(",") if m))
    target = slim(args.wheel, args.out_dir, models=models, drop=tuple(args.drop), keep=tuple(args.keep),
                  compiled=args.drop_compiled)
    print(f"{target}: {target.stat().st_size / 1e6:.2f} MB (from {args.wheel.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
