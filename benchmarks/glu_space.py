"""The GLU sweep's space with captured routing: the problems of `cutlass-tune shapes --device cuda`'s
`*_grouped_glu.yaml` files (the routers' real counts, as histograms) and everything else (the
kernels, dtypes, layouts, epilogue) of a base space, benchmarks/configs/moe_glu_bf16.yaml by default.

    python3 benchmarks/glu_space.py OUT.yaml CAPTURED_GLU.yaml... [--base SPACE.yaml]

Used by benchmarks/gpu_moe_glu.sh (ROUTING=captured). Exits 2 with one line where a file is
missing or holds no problems.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

BASE = Path(__file__).with_name("configs") / "moe_glu_bf16.yaml"


def merged(base: Path, captured: list[Path]) -> dict:
    """`base`'s space with its problems replaced by the captured files' problems, in their order."""
    space = yaml.safe_load(base.read_text())
    problems = []
    for path in captured:
        found = (yaml.safe_load(path.read_text()) or {}).get("problems") or []
        if not found:
            raise ValueError(f"{path}: no problems")
        problems += found
    space["problems"] = problems
    space["description"] = f"the GLU problems of {base.name} with their routers' routing (captured)"
    return space


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("captured", type=Path, nargs="+")
    parser.add_argument("--base", type=Path, default=BASE)
    args = parser.parse_args(argv)
    try:
        space = merged(args.base, args.captured)
    except (OSError, ValueError, yaml.YAMLError, AttributeError) as err:
        print(f"glu_space: {err}", file=sys.stderr)
        return 2
    args.out.write_text(yaml.safe_dump(space, sort_keys=False))
    print(f"{len(space['problems'])} captured GLU problems, the kernels of {args.base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
