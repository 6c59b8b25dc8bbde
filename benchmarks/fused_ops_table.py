"""The per-operation call-site table of `cutlass-tune check -o check.jsonl` on a table of fused
entries: per entry the graph-mode ratio (torch's time over `matmul`'s, sustained) to each torch
path of the same math (eager; torch.compile; cuBLASLt's epilogue where one computes it) and to the
strongest, then the geomean and lowest per epilogue. Markdown on stdout.

    python3 benchmarks/fused_ops_table.py CHECK_JSONL [--mode graph|loop]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path


def rows(path: Path, mode: str) -> list[dict]:
    """One dict per checked entry: shape, epilogue, claimed, ratio per torch path, strongest."""
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        got = (r.get("delivered") or {}).get(mode)
        if not got:
            continue
        tuned = got["tuned"]["median_ms"]
        paths = {"eager": got["torch"]["median_ms"] / tuned}
        paths.update({name: side["median_ms"] / tuned for name, side in (got.get("others") or {}).items()})
        shape, epilogue = r["problem"].split("_")[0], r["problem"].split("_tn_")[-1]
        out.append({"shape": shape, "epilogue": epilogue, "claimed": r.get("claimed"), "paths": paths,
                    "strongest": got["strongest_ratio"], "kernel": r["kernel"]})
    return out


def table(entries: list[dict], mode: str) -> list[str]:
    names = sorted({n for e in entries for n in e["paths"]}, key=lambda n: (n != "eager", n))
    lines = [f"| shape | epilogue | claimed | {' | '.join(f'to {n}' for n in names)} | to the strongest | kernel |",
             "|---" * (len(names) + 5) + "|"]
    for e in sorted(entries, key=lambda e: (e["epilogue"], e["shape"])):
        cells = [f"{e['paths'][n]:.3f}" if n in e["paths"] else "-" for n in names]
        claimed = f"{e['claimed']:.3f}" if isinstance(e["claimed"], float) else "-"
        lines.append(f"| {e['shape']} | {e['epilogue']} | {claimed} | {' | '.join(cells)} | {e['strongest']:.3f} | "
                     f"{e['kernel']} |")
    by_epilogue: dict[str, list[float]] = defaultdict(list)
    for e in entries:
        by_epilogue[e["epilogue"]].append(e["strongest"])
    lines.append("")
    for epilogue, ratios in sorted(by_epilogue.items()):
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        below = sum(x < 1.0 for x in ratios)
        lines.append(f"{epilogue} ({mode}): geomean to the strongest {geo:.3f} over {len(ratios)} shapes, lowest "
                     f"{min(ratios):.3f}, {below} below 1.00")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check_jsonl", type=Path)
    parser.add_argument("--mode", choices=("graph", "loop"), default="graph")
    cli = parser.parse_args()
    print("\n".join(table(rows(cli.check_jsonl, cli.mode), cli.mode)))
