"""The native operators on a Hopper GPU, against torch: a tuned grouped kernel launched from C++
(eager, backward, torch.compile with and without CUDA graphs, a CUDA graph), torch's fallback
called from C++, the dense operators, and host time per call against torch._grouped_mm and
against the Python path (CUTLASS_TUNE_NATIVE=0). Each scenario runs in a fresh process
(tests/runtime/native_gpu_probe.py): the library is built (g++) into the kernel cache once.

Run: pytest tests/runtime/test_native_gpu.py -s (prints each scenario's findings)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built():
    from cutlass_tune.compile._native import build_native

    found = build_native(retry=True)
    assert found.library is not None, found.reason
    return found.library


def probe(scenario: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.runtime.native_gpu_probe", scenario], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, **env}, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.splitlines()[-1])
    print(scenario, found)
    return found


def test_a_tuned_grouped_kernel_runs_from_cpp_and_matches_torch(built):
    out = probe("grouped")
    assert out["plans"] == [3] and out["said"] == []  # one signature, a kernel entry, no fallback said
    assert out["error"] < 1e-2 and out["repeat_equal"]
    assert out["grad_a_error"] < 1e-2 and out["grad_w_error"] < 1e-2
    assert out["grad_python_calls"]["autograd"] == 0  # the C++ autograd Function, not the Python formula


def test_a_native_launch_opens_the_problem_s_profiler_range(built):
    """Guards tune-model on the H200: the native path opened no range, so no kernel time was
    attributed to any problem inside the model."""
    out = probe("profiled")
    assert out["plans"] == [3] and len(out["ranges"]) == 1 and "grouped" in out["ranges"][0], out
    assert out["launches"] or out["kernels"], out  # the launch (or its kernel) lies inside the range


def test_a_fallback_calls_torch_from_cpp(built):
    out = probe("fallback")
    assert out["equal"] and out["plans"] == [0, 1]  # torch's grouped GEMM; float32: the Python door
    assert out["wider_error"] < 1e-2 and out["wider_dtype"] == "torch.float32"
    # once per cause: the table's missing experts (bf16 out), and float32 out, which no 16-bit kernel writes
    assert len(out["said"]) == 2 and "no tuned grouped problem" in out["said"][0], out["said"]
    assert "gives D of the same type" in out["said"][1], out["said"]


def test_compiled_with_no_graph_break_and_with_cuda_graph_trees(built):
    out = probe("compiled")
    assert out["None"] < 1e-2 and out["reduce-overhead"] < 1e-2 and 3 in out["plans"]


def test_a_cuda_graph_replays_new_routing(built):
    out = probe("graph")
    assert out["replay_error"] < 1e-2 and out["eager_error"] < 1e-2


def test_mm_and_linear_run_tuned_dense_kernels(built):
    out = probe("dense")
    assert out["mm_error"] < 1e-2 and out["linear_error"] < 1e-2
    assert out["plans"] == [3, 3] and out["said"] == []


def test_a_linear_the_table_has_no_kernel_for_calls_torch_from_cpp(built):
    """Guards the fallback of linear against going through the Python door on every call."""
    out = probe("linear_fallback")
    assert out["equal"] and out["gelu_error"] < 1e-2
    assert out["plans"] == [1, 1]  # two signatures, each torch's path in C++
    assert len(out["said"]) == 2 and all("using F.linear" in s or "using torch" in s for s in out["said"]), out
    assert out["python_calls"] == {"resolve": 0, "door": 0, "autograd": 0}
    # the compiled graph's extern kernel: torch's path written into its buffer, bit for bit
    assert out["into"] == {"relu": True, "silu": True, "gelu_tanh_3d": True, "plain_relu": True, "compiled": True}, out


def test_mm_and_linear_gradients_from_the_cpp_autograd_functions(built):
    out = probe("dense_grad")
    errors = {k: v for k, v in out.items() if k.endswith("_error")}
    assert len(errors) == 5 and all(v < 2e-2 for v in errors.values()), errors
    assert out["python_calls"]["autograd"] == 0 and out["python_calls"]["door"] == 0
    assert 3 in out["plans"]  # tuned kernels served the forward and the backward GEMMs


def test_the_function_doors_run_through_the_library(built):
    out = probe("doors")
    for name in ("matmul", "grouped", "fp8"):
        assert out[f"{name}_error"] < 1e-2 and out[f"{name}_repeat_equal"], (name, out)
        assert out[f"{name}_first_calls"]["resolve"] == 1, (name, out)  # checked once per signature
        assert out[f"{name}_repeat_calls"] == {"resolve": 0, "door": 0, "autograd": 0}, (name, out)
    assert out["grouped_plans"] == [3] and out["fp8_plans"] == [3] and out["fp8_said"] == []
    assert "16-byte aligned" in out["misaligned"]  # the door's own error, on a signature C++ knows


def test_host_time_per_call_below_the_python_path(built):
    native = probe("host")
    python = probe("host", CUTLASS_TUNE_NATIVE="0")
    assert native["native"] and not python["native"]
    # The goal is torch's own time; the test holds the C++ path below the Python one.
    assert native["grouped op"] < python["grouped op"], (native, python)
    assert native["mm op"] < python["mm op"], (native, python)
    assert native["mm op grad"] < python["mm op grad"], (native, python)
    assert native["linear fallback op"] < python["linear fallback op"], (native, python)
    assert native["matmul door"] < python["matmul door"], (native, python)
    assert native["grouped door"] < python["grouped door"], (native, python)


def test_the_moe_glu_stage_launches_from_cpp(built):
    """The GLU stage's kernel from C++ (`grouped_glu`), resolved once per signature: the layer's
    repeat calls no Python hook, and one stage call costs less host time than the Python path."""
    native = probe("glu")
    python = probe("glu", CUTLASS_TUNE_NATIVE="0")
    assert native["native"] and not python["native"]
    assert native["error"] < 2e-2 and native["repeat_equal"] and native["said"] == [], native
    assert native["glu_plans"] == [3], native  # a kernel entry
    assert native["repeat_calls"] == {"resolve": 0, "door": 0, "autograd": 0}, native
    assert native["stage_us"] < python["stage_us"], (native, python)


def test_the_fp8_operator_launches_from_cpp_and_keeps_torch_from_cpp(built):
    """`scaled_mm` (Fp8Linear's GEMM under torch.compile): the tuned kernel from C++ with no Python
    hook on a repeat; a row held below min_ratio runs torch._scaled_mm from C++ with the kernel's
    fast accumulation, bit for bit what the Python fallback computes; both cost less host time a
    call than the Python path's."""
    native = probe("scaled")
    python = probe("scaled", CUTLASS_TUNE_NATIVE="0")
    assert native["native"] and not python["native"]
    assert native["error"] < 1e-2 and native["repeat_equal"] and native["said"] == [], native
    assert native["plans"] == [3] and native["kept_plans"] == [1], native  # a kernel entry, a torch entry
    assert native["repeat_calls"] == native["kept_repeat_calls"] == {"resolve": 0, "door": 0, "autograd": 0}, native
    assert native["kept_equal"] and python["kept_equal"], (native, python)
    # the key bound to the held table (whose plans the other key made) and back: nothing resolved again
    assert native["rebound_equal"], native
    assert native["rebound_calls"] == native["back_calls"] == {"resolve": 0, "door": 0, "autograd": 0}, native
    assert native["op_us"] < python["op_us"] and native["kept_us"] < python["kept_us"], (native, python)


def test_compiled_graphs_call_the_operators_as_extern_kernels(built):
    """torch.compile calls each operator as the native library's out variant (runtime/_lowering.py):
    `cutlass_tune_extern.<op>(..., buf)`, no dispatcher call; results equal to the eager
    operator's; tuned kernels write into Inductor's buffer (no copy); a repeat calls no Python
    hook; and a compiled chain of fp8 GEMMs costs less host time a GEMM than through the
    dispatcher (CUTLASS_TUNE_EXTERN=0)."""
    extern = probe("extern")
    # compiled anew: Inductor's cache (its key does not see the setting) holds the first probe's graphs
    dispatcher = probe("extern", CUTLASS_TUNE_EXTERN="0", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    for name in ("scaled", "scaled_kept", "mm", "linear_fallback", "grouped"):
        calls = extern[f"{name}_calls"]
        assert len(calls) == 1 and calls[0].startswith("cutlass_tune_extern."), (name, calls)
        assert "_cpu(" not in calls[0], (name, calls)  # the native library's kernel, not the CPU's
        assert re.search(r", buf\d+\)$", calls[0]), (name, calls)  # Inductor's buffer, last and positional
        assert extern[f"{name}_equal"], (name, extern)
        assert extern[f"{name}_repeat_calls"] == {"resolve": 0, "door": 0, "autograd": 0}, (name, extern)
        if extern[f"{name}_in_place"]:
            assert extern[f"{name}_copies"] == 0, (name, extern)
        first = dispatcher[f"{name}_calls"][0]
        assert first.startswith("buf") and "torch.ops.cutlass_tune" in first, (name, first)
        assert dispatcher[f"{name}_equal"], (name, dispatcher)
    assert dispatcher["lowered"] == {}
    assert extern["chain_ours_us_per_gemm"] < dispatcher["chain_ours_us_per_gemm"], (extern, dispatcher)


def test_the_compiled_moe_layer_calls_its_operators_as_extern_kernels(built):
    """The MoE layer under torch.compile: its routing one operator call, then its gather, GLU
    stage, down GEMM and combine as the native library's out variants (runtime/_lowering.py),
    each writing into Inductor's buffer (no copy, no Python hook on a repeat), the result the eager
    layer's bit for bit; less host time a layer than the same graph through the dispatcher."""
    out = probe("extern_moe")
    kernels = [c.split("(")[0] for c in out["calls"] if c.startswith("cutlass_tune_extern.")]
    assert kernels == ["cutlass_tune_extern.moe_gather_into", "cutlass_tune_extern.moe_gate_up_glu_into",
                       "cutlass_tune_extern.grouped_mm_into", "cutlass_tune_extern.moe_combine_into"], out
    # the routing (four results: Inductor's multi-output fallback) is the one dispatcher call left
    dispatched = [c for c in out["calls"] if "torch.ops.cutlass_tune." in c and "moe_route" not in c]
    assert dispatched == [] and out["calls"][0].startswith("buf0 = torch.ops.cutlass_tune.moe_route.default("), out
    assert out["equal"] and out["dispatcher_equal"], out
    assert out["repeat_calls"] == {"resolve": 0, "door": 0, "autograd": 0} and out["copies"] == 0, out
    assert any("torch.ops.cutlass_tune.moe_gate_up_glu.default(" in c for c in out["dispatcher_calls"]), out
    assert not any("cutlass_tune_extern" in c for c in out["dispatcher_calls"]), out
    assert out["layer_us"] < out["dispatcher_us"], out


def test_a_planned_transformers_layer_compiles_the_lean_path(built):
    """The "cutlass_tune" experts of a module planned in eager code, compiled for inference: the
    same operators as the full path (the routing, then gather, GLU stage, down GEMM and combine
    as extern kernels), the fused layer's result bit for bit, and less host time a call than the
    full path traced on the same kept plan (Dynamo checks fewer guards)."""
    out = probe("lean_experts")
    assert out["lean_index"] is not None and out["lean_index"] >= 0 and out["full_index"] is None, out
    assert out["lean_calls"] == out["full_calls"], out
    assert "cutlass_tune_extern.moe_gate_up_glu_into" in out["lean_calls"], out
    assert out["lean_equal"] and out["full_equal"], out
    assert out["lean_us"] < out["full_us"], out
