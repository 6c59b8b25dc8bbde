"""benchmarks/moe_layer.py without a GPU: the kernel parts it reads from a profile, its summary, and
one tiny eager case on the CPU (the real widths run on the GPU, benchmarks/gpu_moe_layer.sh)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "moe_layer.py"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(SCRIPT.parent))  # its helpers beside it, as when it runs as a script
    spec = importlib.util.spec_from_file_location("moe_layer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["moe_layer"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["moe_layer"]
    sys.path.remove(str(SCRIPT.parent))


def test_parts_follow_the_launch_order_around_the_two_gemms(script):
    # transformers' "grouped_mm" experts as one eager call launches them (names shortened)
    kernels = [("at::native::radixSortKVInPlace", 6.0), ("void at::native::index_elementwise_kernel", 13.0),
               ("at::native::histogram1d_kernel", 1.0), ("at::cuda::cub::DeviceScanKernel", 2.0),
               ("at::cuda::detail::prepare_grouped_gemm_data", 3.0),
               ("cutlass::device_kernel<KernelPtrArrayTmaWarpSpecializedCooperative>", 100.0),
               ("void at::native::vectorized_elementwise_kernel<silu>", 5.0),
               ("void at::native::vectorized_elementwise_kernel<mul>", 2.0),
               ("at::cuda::detail::prepare_grouped_gemm_data", 3.0),
               ("cutlass::device_kernel<KernelPtrArrayTmaWarpSpecializedCooperative>", 80.0),
               ("void at::native::vectorized_elementwise_kernel<mul>", 4.0),
               ("void at::native::index_put_kernel", 1.0), ("void at::native::index_elementwise_kernel", 30.0),
               ("void at::native::reduce_kernel<sum>", 10.0)]
    got = script.parts(kernels)
    assert got == {"routing": 9.0, "gather": 13.0, "gate_up GEMM": 103.0, "activation": 7.0, "down GEMM": 83.0,
                   "combine": 45.0}
    assert sum(got.values()) == sum(t for _, t in kernels)


def test_a_fused_layer_without_glue_kernels_and_a_call_without_two_gemms(script):
    fused = [("moe_routing_kernel", 2.0), ("cutlass::device_kernel<GemmUniversal grouped>", 90.0),
             ("cutlass::device_kernel<GemmUniversal grouped>", 70.0), ("cutlass_tune_moe_combine", 20.0)]
    got = script.parts(fused)  # the activation in gate_up's epilogue: the two GEMMs back to back
    assert (got["routing"], got["gate_up GEMM"], got["activation"], got["down GEMM"], got["combine"]) == \
        (2.0, 90.0, 0.0, 70.0, 20.0)
    assert script.parts([("cutlass::device_kernel<x>", 5.0), ("reduce", 1.0)])["unassigned"] == 6.0


def test_a_dense_gemm_after_the_down_gemm_is_the_combine_s(script):
    """Guards GPT-OSS's parts: its down bias (a tokens x experts product after the combine) was
    taken for the down GEMM, and the down GEMM for an "other GEMM"."""
    kernels = [("cutlass_tune_moe_gather", 3.0),
               ("cutlass::device_kernel<GemmUniversal<GroupProblemShape<...>>>", 90.0), ("clamped_swiglu", 5.0),
               ("cutlass::device_kernel<GemmUniversal<GroupProblemShape<...>>>", 40.0),
               ("cutlass_tune_moe_combine", 2.0), ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_cublas", 4.0),
               ("vectorized_elementwise_kernel<add>", 1.0)]
    got = script.parts(kernels)
    assert (got["gate_up GEMM"], got["activation"], got["down GEMM"], got["combine"], got.get("other GEMM", 0.0)) == \
        (90.0, 5.0, 40.0, 7.0, 0.0)
    assert not script.is_gemm("moe_combine_kernel") and script.is_gemm("nvjet_sm90_tst_128x64")


def _case(family, tokens, mode, torch_ms, ours_ms, *, train=False):
    side = {"skip": "", "median_ms": ours_ms, "relative_error": 1e-3, "fallbacks": []}
    return {"family": family, "tokens": tokens, "mode": mode, "train": train, "strongest_torch": "grouped_mm",
            "speedup": {"cutlass_tune": torch_ms / ours_ms},
            "sides": {"grouped_mm": {**side, "median_ms": torch_ms, "relative_error": 0.0},
                      "cutlass_tune": side, "moe_experts": {"skip": "the package has no cutlass_tune.moe_experts"}}}


def test_the_summary_has_a_line_per_case_and_skips_other_files(script, tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_case("qwen3_235b", 4096, "compiled", 3.0, 2.0)))
    (tmp_path / "b.json").write_text(json.dumps(_case("deepseek_v2", 1, "graphs", 0.5, 0.4, train=True)))
    (tmp_path / "cut.json").write_text('{"family": ')
    (tmp_path / "profile.json").write_text("[1]")
    lines = script.summary(tmp_path).splitlines()
    assert len(lines) == 3
    assert lines[1].split() == ["qwen3_235b", "4096", "compiled", "grouped_mm", "3.000", "2.000", "-", "-", "-",
                                "1.500", "-", "-", "-", "-", "1.0e-03", "0", "moe_experts"]
    assert lines[2].split()[:3] == ["deepseek_v2", "1", "graphs-train"]


@pytest.mark.parametrize("argv", [["--mode", "graphs", "--train"], ["--tokens", "0"], ["--family", "t5"]])
def test_bad_arguments_exit_2(script, tmp_path, argv):
    with pytest.raises(SystemExit) as exit_:
        script.parse_args(["none", str(tmp_path), *argv])
    assert exit_.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU mode")
def test_a_tiny_eager_case_compares_every_side_with_grouped_mm(script, tmp_path, capsys):
    pytest.importorskip("transformers")
    argv = ["none", str(tmp_path), "--family", "qwen3_moe", "--tiny", "--tokens", "8", "--blocks", "2", "--block", "1"]
    assert script.main(argv) == 0
    result = json.loads((tmp_path / "qwen3_moe-8-eager-tiny.json").read_text())
    sides = result["sides"]
    assert {"grouped_mm", "batched_mm", "cutlass_tune", "moe_experts", "moe_glu", "moe_batched"} <= {
        n for n, s in sides.items() if not s["skip"]}
    assert all(s["close"] and len(s["blocks_ms"]) == 2 for s in sides.values() if not s["skip"])
    assert result["strongest_torch"] in ("grouped_mm", "batched_mm") and "cutlass_tune" in result["speedup"]
    assert result["glu_path"] == "apart: the weights are not on a CUDA device"  # the layer's own answer, recorded
    assert script.main(argv) == 0  # a case whose JSON exists is not run again
    assert "exists, skipped" in capsys.readouterr().out


def test_the_model_profile_splits_grouped_gemms_from_the_glue_and_the_rest(script):
    import moe_model  # beside moe_layer.py, on the path the fixture set

    split = moe_model.kernel_split([("cutlass::device_kernel<KernelPtrArrayTmaWarpSpecializedPingpong>", 300.0),
                                    ("at::cuda::detail::prepare_grouped_gemm_data", 10.0),
                                    ("moe_combine_kernel", 40.0), ("flash_fwd_kernel", 150.0)])
    assert split == pytest.approx({"kernels_ms": 0.5, "grouped_gemm_ms": 0.31, "moe_glue_ms": 0.04, "other_ms": 0.15})


def test_the_model_profile_finds_where_the_gpu_waits_between_kernels(script):
    import moe_model

    # two streams overlap (b inside a's span), then the GPU waits 30 us, then 5 us
    idle = moe_model.gpu_gaps([("a", 0.0, 100.0), ("b", 20.0, 60.0), ("c", 130.0, 150.0), ("d", 155.0, 160.0)])
    assert idle["idle_ms"] == pytest.approx(0.035)
    assert idle["longest"] == [(30.0, "a", "c"), (5.0, "c", "d")]
    assert moe_model.gpu_gaps([]) == {"idle_ms": 0.0, "longest": []}


def test_the_gain_splits_into_gemms_glue_and_what_the_kernels_do_not_explain(script):
    torch_parts = {"routing": 0.06, "gather": 0.13, "gate_up GEMM": 1.71, "activation": 0.07, "down GEMM": 0.67,
                   "combine": 0.45}
    ours = {"routing": 0.06, "gather": 0.13, "gate_up GEMM": 1.44, "activation": 0.07, "down GEMM": 0.62,
            "combine": 0.10}
    split = script.gain_split(torch_parts, ours, 3.2, 2.5)
    assert split == pytest.approx({"total": 0.7, "gemms": 0.32, "glue": 0.35, "host_and_gaps": 0.03})


def test_a_gradient_is_close_within_the_tolerance_or_torchs_own_disagreement(script):
    """The router's gradient cancels through the top-k normalization: two of torch's own bf16
    paths differ by about 0.14 there, so it is held to that floor, not to 2e-2."""
    import moe_model

    floors = {"gate.weight": 0.14, "experts.down_proj": 0.004}
    ok, worst = moe_model.grads_close({"gate.weight": 0.11, "experts.down_proj": 0.008}, floors)
    assert ok and worst["parameter"] == "gate.weight" and worst["allowed"] == pytest.approx(0.21)
    ok, worst = moe_model.grads_close({"gate.weight": 0.11, "experts.down_proj": 0.03}, floors)
    assert not ok and worst["parameter"] == "experts.down_proj"  # 0.03 > max(2e-2, 1.5 x 0.004)
    ok, worst = moe_model.grads_close({"gate.weight": 0.11}, {})  # no floor measured: the tolerance alone
    assert not ok and worst["floor"] is None
    assert moe_model.grads_close({}, {}) == (True, None)


@pytest.mark.parametrize(("flags", "refused"), [
    (["--capture", "--compile"], "--capture is for inference, of the eager layers"),
    (["--capture", "--train"], "--capture is for inference, of the eager layers"),
    (["--graphs"], "--graphs goes with --compile"),
])
def test_the_model_script_refuses_regimes_it_cannot_time(script, monkeypatch, capsys, flags, refused):
    import moe_model

    monkeypatch.setattr(sys, "argv", ["moe_model.py", "table", "out", *flags])
    with pytest.raises(SystemExit) as stopped:
        moe_model.main()
    assert stopped.value.code == 2 and refused in capsys.readouterr().err


def test_a_captured_decode_run_is_named_for_its_regime(script):
    import argparse

    import moe_model

    args = argparse.Namespace(train=False, decode=True, graphs=False, compile=False, capture=True, no_glu=False,
                              whole=False)
    assert moe_model._mode(args) == "decode-capture"
    assert moe_model._mode(argparse.Namespace(**{**vars(args), "capture": False, "compile": True})) == "decode-compile"
    whole = argparse.Namespace(**{**vars(args), "capture": False, "compile": True, "graphs": True, "whole": True})
    assert moe_model._mode(whole) == "decode-graphs-whole"  # apart from the per-layer graphs' file
