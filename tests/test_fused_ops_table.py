"""benchmarks/fused_ops_table.py: the per-operation table of `cutlass-tune check`'s JSON lines."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fused_ops_table.py"


def _module():
    spec = importlib.util.spec_from_file_location("fused_ops_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(problem, tuned, eager, compiled, strongest):
    side = {"median_ms": None}
    mode = {"tuned": {**side, "median_ms": tuned}, "torch": {**side, "median_ms": eager},
            "others": {"torch.compile": {**side, "median_ms": compiled}}, "strongest_ratio": strongest}
    return json.dumps({"problem": problem, "kernel": "k", "claimed": 1.1, "delivered": {"graph": mode}})


def test_ratios_per_torch_path_and_the_geomean_per_epilogue(tmp_path):
    path = tmp_path / "check.jsonl"
    path.write_text("\n".join([_line("4096x4096x4096_bf16bf16bf16_tn_silu+gated", 1.0, 1.2, 0.9, 0.9),
                               _line("2048x4096x4096_bf16bf16bf16_tn_silu+gated", 1.0, 1.3, 1.1, 1.1),
                               json.dumps({"problem": "8x8x8_bf16bf16bf16_tn_residual", "kernel": "k",
                                           "error": "a kernel CUTLASS refuses"})]))
    module = _module()
    entries = module.rows(path, "graph")
    assert [(e["shape"], e["epilogue"]) for e in entries] == [("4096x4096x4096", "silu+gated"),
                                                               ("2048x4096x4096", "silu+gated")]
    assert entries[0]["paths"] == {"eager": 1.2, "torch.compile": 0.9}
    lines = module.table(entries, "graph")
    assert lines[0].startswith("| shape | epilogue | claimed | to eager | to torch.compile | to the strongest |")
    assert lines[-1] == ("silu+gated (graph): geomean to the strongest 0.995 over 2 shapes, lowest 0.900, "
                         "1 below 1.00")
