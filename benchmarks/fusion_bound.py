"""The most fusing GEMM epilogues can save in the three e2e models, from the bytes it removes.

    python3 benchmarks/fusion_bound.py [RESULTS_DIR ...] [--rate-tbs 2.79]

A fused epilogue saves the memory passes of the pointwise work after a GEMM that torch's path
runs as kernels of their own; it does not make the GEMM's own FLOPs cheaper. For each model of
`benchmarks/fusion_model.py` (BERT-large, GPT-NeoX at Pythia-6.9B widths, LLaMA at Llama-3-8B
widths, their tokens and layers) and each regime, this counts the elements each layer's fused
sites stop writing and reading again (`SITES`, below, says which and why), prices them at
`--rate-tbs` (default: the 2.79 TB/s of Inductor's erf-GELU kernel on the H200, 134 MB in 48.1
us, `results/fusion_e2e_h200_20261127/profiles/bert-infer-compile-before.txt`), and sets the
saving against the plain model's measured step (the JSON files of `fusion_model.py` in
RESULTS_DIR; the committed H200 runs by default):

    bound = plain step / (plain step - saved passes)

the speedup of a fused model whose fused GEMMs run exactly as fast as torch's unfused ones. A
fused model beats it only where its GEMMs beat cuBLAS's (the builder's kernels sit at 0.95-1.01 of
cuBLAS on plain GEMMs). Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "results"
DEFAULT_RESULTS = [ROOT / "session_20261127c" / "h200_graphs" / "fusion", ROOT / "fusion_e2e_h200_20261127" / "final"]

MODELS = {  # fusion_model.py's FAMILIES: tokens M, hidden H, intermediate I, layers
    "bert": dict(m=8192, h=1024, i=4096, layers=4),
    "gpt_neox": dict(m=4096, h=4096, i=16384, layers=2),
    "llama": dict(m=4096, h=4096, i=14336, layers=2),
}

# Elements of bf16 traffic each layer's fusion removes, per regime, in units of M x I ("i") and
# M x H ("h"). What torch runs without fusion:
# - eager: F.linear (cuBLAS adds the bias in its epilogue), then each activation, product and
#   residual add as a kernel of its own;
# - compiled (Inductor, torch 2.11 on the H200): cuBLAS's GEMM with the bias in its epilogue, then
#   every activation (erf or tanh GELU, ReLU) or SiLU * up as one Triton kernel; a residual add
#   joins the normalization kernel that follows it. (Inductor does not use cuBLASLt's
#   activation epilogue: in `epilogue_gap.md` torch.compile's time of bias+gelu_tanh and
#   bias+relu is about eager's, 24-26% above `_addmm_activation`'s at 8192x4096x1024.)
SITES = {
    ("bert", "eager"): {
        # bias+gelu (erf): the GELU kernel's read and write of the GEMM's output (M x I) go.
        # bias+residual x2 (attention output, output): the add's read of Y and its write of the
        # sum, against the GEMM's write of the sum for Y's (R is read in both): 2 M x H each.
        "i": 2, "h": 4},
    ("bert", "compiled"): {
        # bias+gelu: as eager. bias+residual: Inductor's add+LayerNorm kernel reads Y and R; the
        # fused one reads the sum: R moves into the GEMM, nothing goes.
        "i": 2, "h": 0},
    ("gpt_neox", "eager"): {
        # bias+gelu_tanh: the GELU kernel's read and write of M x I. `patch` fuses no residual.
        "i": 2, "h": 0},
    ("gpt_neox", "compiled"): {
        # bias+gelu_tanh: the Triton GELU kernel's read and write of M x I go. Parallel residual
        # (x + attn + mlp): the sum's inputs are read once either way.
        "i": 2, "h": 0},
    ("llama", "eager"): {
        # silu(gate) * up: eager writes U, SiLU reads G and writes S, the product reads S and U
        # and writes D (7 M x I with the GEMMs' writes); fused: G written, read, D written (3).
        # `patch` fuses no residual.
        "i": 4, "h": 0},
    ("llama", "compiled"): {
        # silu+gated: Inductor's one kernel reads G and U and writes D; fused, U is never
        # written nor read: 2 M x I. residual x2 (o_proj, down_proj): add+RMSNorm reads Y and R
        # and writes the sum and the norm; fused, the GEMM reads R and writes the sum, the norm
        # reads it: one M x H each.
        "i": 2, "h": 2},
}

GOALS = {"bert": 1.10, "gpt_neox": 1.10, "llama": 1.05}


def _measured(dirs: list[Path]) -> dict[tuple[str, str], dict]:
    """(family, regime) -> the newest run's JSON of that regime: "compiled" prefers CUDA graphs
    (infer-graphs: no host time in the step) over infer-compile; "eager" is infer."""
    runs: dict[tuple[str, str], dict] = {}
    for d in dirs:
        for path in sorted(d.glob("*.json")):
            r = json.loads(path.read_text())
            regime = {"infer": "eager", "infer-graphs": "compiled", "infer-compile": "compiled"}.get(r.get("mode"))
            if regime is None or r.get("family") not in MODELS:
                continue
            key = (r["family"], regime)
            if key not in runs or (runs[key]["mode"] == "infer-compile" and r["mode"] == "infer-graphs"):
                runs[key] = r
    return runs


def bounds(runs: dict[tuple[str, str], dict], rate: float) -> list[dict]:
    out = []
    for (family, regime), units in SITES.items():
        run = runs.get((family, regime))
        if run is None:
            continue
        s = MODELS[family]
        elements = units["i"] * s["m"] * s["i"] + units["h"] * s["m"] * s["h"]
        saved_ms = s["layers"] * elements * 2 / rate * 1e3
        plain, fused = run["median_ms"]["plain"], run["median_ms"]["fused"]
        out.append({"family": family, "regime": regime, "mode": run["mode"], "saved_mb_per_layer": elements * 2 / 1e6,
                    "saved_ms": saved_ms, "plain_ms": plain, "bound": plain / (plain - saved_ms),
                    "measured": plain / fused, "goal": GOALS[family]})
    return out


def render(rows: list[dict], rate: float) -> str:
    lines = [f"passes priced at {rate / 1e12:.2f} TB/s",
             f"{'model':<9} {'regime':<9} {'run':<14} {'MB/layer':>8} {'saved ms':>8} {'plain ms':>8} {'bound':>6} "
             f"{'measured':>8} {'goal':>5}"]
    for r in rows:
        lines.append(f"{r['family']:<9} {r['regime']:<9} {r['mode']:<14} {r['saved_mb_per_layer']:>8.1f} "
                     f"{r['saved_ms']:>8.3f} {r['plain_ms']:>8.3f} {r['bound']:>6.3f} {r['measured']:>8.3f} "
                     f"{r['goal']:>5.2f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", type=Path, default=DEFAULT_RESULTS,
                        help="directories of fusion_model.py's JSON files")
    parser.add_argument("--rate-tbs", type=float, default=2.79)
    args = parser.parse_args()
    rate = args.rate_tbs * 1e12
    print(render(bounds(_measured(args.results), rate), rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
