"""The GLU sweep's space with captured routing: the problems of `cutlass-tune shapes --device cuda`'s
files (the routers' real counts, as histograms) and everything else (the kernels, dtypes, layouts,
epilogue) of a base space, benchmarks/configs/moe_glu_bf16.yaml by default.

    python3 benchmarks/glu_space.py OUT.yaml CAPTURED.yaml... [--base SPACE.yaml]

A file's problems are GLU problems already (`*_grouped_glu.yaml`), but a `*_grouped.yaml` file holds a
layer's plain grouped GEMMs (torch's "grouped_mm" experts pose no GLU problem: the capture records
a GLU twin only where it sees act(gate) * up of one GEMM's halves): its gate_up problems, each the
one whose N is twice the K of a down problem of the same experts and routed rows (and whose K is
that down problem's N), become GLU problems with the base space's epilogue and their routing.

Used by benchmarks/gpu_moe_glu.sh (ROUTING=captured). Exits 2 with one line where a file is
missing or holds no problems.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

BASE = Path(__file__).with_name("configs") / "moe_glu_bf16.yaml"


def gate_ups(problems: list[dict], epilogue: str) -> list[dict]:
    """The gate_up problems of a file of plain grouped problems (see the module), as GLU problems
    with `epilogue`."""
    out = []
    for p in problems:
        downs = [d for d in problems if d is not p and d.get("experts") == p.get("experts")
                 and d.get("rows") == p.get("rows") and d.get("n") == p.get("k") and 2 * d.get("k", 0) == p.get("n")]
        if downs:
            out.append({**p, "epilogue": epilogue})
    return out


def merged(base: Path, captured: list[Path]) -> dict:
    """`base`'s space with its problems replaced by the captured files' GLU problems, in their order."""
    space = yaml.safe_load(base.read_text())
    problems = []
    for path in captured:
        found = (yaml.safe_load(path.read_text()) or {}).get("problems") or []
        plain = path.name.endswith("_grouped.yaml")
        if plain:
            found = gate_ups(found, space["epilogue"])
        if not found:
            raise ValueError(f"{path}: no {'gate_up problems' if plain else 'problems'}")
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
