"""benchmarks/configs/moe_fp8_blockwise.yaml without a GPU: the fp8 MoE experts' space file as a
sweep loads it (benchmarks/gpu_fp8_grouped.sh sweeps it on the GPU)."""

from pathlib import Path

from cutlass_tune.space import DType, Layout, Scaling, check_config, check_pair, check_problem, load_space

SPACE = Path(__file__).resolve().parents[1] / "benchmarks" / "configs" / "moe_fp8_blockwise.yaml"


def test_the_fp8_moe_space_holds_qwen3_and_deepseek_experts_and_a_handful_of_blockwise_kernels():
    space = load_space(SPACE)
    problems = space.problems
    assert len(problems) >= 4
    for p in problems:
        assert p.grouped and check_problem(p) == [], p.name
        assert (p.dtype_a, p.dtype_b, p.dtype_d, p.layout_b) == (DType.E4M3, DType.E4M3, DType.BF16, Layout.COL)
        assert p.scaling is Scaling.BLOCKWISE
    # gate_up (N = 2 x the expert width, K = hidden) and down (K = the expert width) of each family
    shapes = {(p.groups, p.n, p.k) for p in problems}
    assert {(128, 1536, 2048), (128, 2048, 768), (128, 3072, 4096), (128, 4096, 1536)} <= shapes
    assert {(256, 512, 7168), (32, 7168, 2048)} <= shapes
    rows = [p.m for p in problems]  # tokens x top-8: 256 tokens to 4096 (16k over 8 expert-parallel ranks)
    assert min(rows) == 256 * 8 and max(rows) == 4096 * 8
    kernels = list(space.valid)
    assert len(kernels) == 6  # the two tiles the grouped block-wise mainloop builds, three clusters each
    for cfg in kernels:
        assert check_config(cfg) == [] and (cfg.tile_n, cfg.tile_k) == (128, 128) and not cfg.epilogue_source
        assert all(check_pair(cfg, p) == [] for p in problems)
    assert space.census().invalid == {}


def test_the_ratios_report_takes_the_faster_torch_path_as_the_one_to_beat(tmp_path, capsys):
    import importlib.util

    from cutlass_tune.bench import Job
    from cutlass_tune.space import RuntimeArgs
    from cutlass_tune.status import Status
    from cutlass_tune.store import open_store

    space = load_space(SPACE)
    store = open_store(tmp_path / "s.sqlite", new=True)
    cfg = next(iter(space.valid))
    for p, loop_ms in zip(space.problems[:2], (3.0, 1.6)):  # the loop slower, then faster, than dequant + grouped_mm
        store.add(Job.baseline(p).measurement(RuntimeArgs(), Status.OK, median_ms=2.0, loop_median_ms=loop_ms,
                                              dense_median_ms=0.5, tflops=100.0, reason="the paths"),
                  gpu="fake", run_id="r")
        kernel = Job(p, (RuntimeArgs(),), library=tmp_path / "k.so", symbol="s", config=cfg)
        store.add(kernel.measurement(RuntimeArgs(), Status.OK, median_ms=1.0, baseline_median_ms=2.0, tflops=200.0),
                  gpu="fake", run_id="r")
    spec = importlib.util.spec_from_file_location("moe_fp8_ratios", SPACE.parents[1] / "moe_fp8_ratios.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(str(tmp_path / "s.sqlite"))
    lines = capsys.readouterr().out.splitlines()
    assert "| 2.000 | 3.000 | 2.000 (torch._grouped_mm) |" in lines[2]
    assert "| 2.000 | 1.600 | 1.600 (torch expert loop) |" in lines[3]
    assert lines[4] == f"geomean vs strongest torch path: {(2.0 * 1.6) ** 0.5:.3f} over 2 problems"
    assert lines[5] == "baseline: the paths"
