"""The tuned grouped GEMM of MoE experts on a Hopper GPU: `cutlass_tune.grouped_mm` and
torch.ops.cutlass_tune.grouped_mm against torch._grouped_mm (tuned kernels compiled on first use,
nvcc), the fallback, CUDA graphs, torch.compile, backward, and a transformers MoE model.

Run: pytest tests/runtime/test_grouped_gpu.py -s (prints the model's timings)."""

import json
import statistics
import warnings

import pandas as pd
import pytest
import torch

import cutlass_tune
from cutlass_tune.runtime import BestTable, register_table
from cutlass_tune.space import Grouping, KernelConfig, KernelSchedule, Layout, Problem, TileScheduler
from cutlass_tune.tables import experts_cells

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

E, N, K, M = 8, 512, 1024, 4096


def kernel(layout_b: Layout) -> KernelConfig:
    """A cooperative 128x128x64 grouped kernel (a valid grouped config of either B layout)."""
    return KernelConfig(tile_m=128, tile_n=128, tile_k=64, kernel_schedule=KernelSchedule.COOPERATIVE,
                        tile_scheduler=TileScheduler.PERSISTENT, layout_b=layout_b, grouping=Grouping.GROUPED)


def grouped_table(entries) -> BestTable:
    """A table of one grouped kernel per (experts, n, k, rows, layout_b), each measured faster than torch."""
    rows = []
    for e, n, k, m, layout_b in entries:
        cfg = kernel(layout_b)
        p = Problem.experts(e, n, k, m, **cfg.operation.operation_fields())
        rows.append(dict(gpu="any", problem=p.name, m=m, n=n, k=k, kernel=cfg.name, config_hash=cfg.hash,
                         config=json.dumps(cfg.to_dict(), sort_keys=True), raster="along_n", swizzle=1, splits=1,
                         decomposition="heuristic", ratio=1.5, **p.operation.cells(), **experts_cells(p)))
    return BestTable(pd.DataFrame(rows))


TABLE = [(E, N, K, M, Layout.COL), (E, N, K, M, Layout.ROW), (E, K, N, M, Layout.ROW)]  # the last: dA of tn


def operands(layout="tn", counts=(700, 0, 1200, 300, 900, 500, 196, 300), grad=False):
    torch.manual_seed(0)
    a = torch.randn(sum(counts), K, dtype=torch.bfloat16, device="cuda", requires_grad=grad)
    shape = (E, N, K) if layout == "tn" else (E, K, N)
    w = (torch.randn(*shape, dtype=torch.bfloat16, device="cuda") / 32).requires_grad_(grad)
    b = w.transpose(-2, -1) if layout == "tn" else w
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    return a, w, b, offs


def close(got, want, tol=1e-2):
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < tol


def no_fallback(caught):
    assert not [w for w in caught if "cutlass_tune" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.parametrize("layout", ["tn", "tt"])
def test_tuned_kernel_matches_torch_grouped_mm(layout):
    table = grouped_table(TABLE)
    a, _, b, offs = operands(layout)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cutlass_tune.grouped_mm(a, b, offs, table=table)
        again = cutlass_tune.grouped_mm(a, b, offs, table=table)  # the fast path
    no_fallback(caught)
    assert any(ready.gemm is not None for ready in table.plans.entries())
    close(got, torch._grouped_mm(a, b, offs))
    torch.testing.assert_close(again, got, rtol=0, atol=0)


def test_new_counts_at_the_same_address_are_read_each_launch():
    """Guards the kernel rebuilding its per-group arrays from offs on every launch."""
    table = grouped_table(TABLE)
    a, _, b, offs = operands()
    cutlass_tune.grouped_mm(a, b, offs, table=table)
    offs.copy_(torch.tensor((0, 2000, 2000, 2500, 3000, 3500, 4000, 4096), device="cuda", dtype=torch.int32))
    close(cutlass_tune.grouped_mm(a, b, offs, table=table), torch._grouped_mm(a, b, offs))


def test_fallback_for_untuned_experts_warns_once_and_equals_torch():
    table = grouped_table([(16, N, K, M, Layout.COL)])
    a, _, b, offs = operands()
    with pytest.warns(RuntimeWarning, match="no tuned grouped problem of 8 experts of 512x1024"):
        got = cutlass_tune.grouped_mm(a, b, offs, table=table)
    torch.testing.assert_close(got, torch._grouped_mm(a, b, offs), rtol=0, atol=0)


@pytest.mark.parametrize(("change", "message"), [
    (lambda a, b, o: (a.float(), b.float(), o), "the tuned grouped kernels take bfloat16, float16 or float8_e4m3fn"),
    (lambda a, b, o: (a[:, :1020], b[:, :1020], o), "must be multiples of 8"),
    (lambda a, b, o: (a, b, o.long()), "offs must be 8 int32 values"),
    (lambda a, b, o: (a, b, o.cpu()), "offs is on cpu: the tuned kernels run on a CUDA device"),
    (lambda a, b, o: (a.t().contiguous().t(), b, o), "not row-major contiguous"),
])
def test_bad_operands_are_one_line_errors(change, message):
    a, _, b, offs = operands()
    with pytest.raises(cutlass_tune.runtime.MatmulInputError, match=message):
        cutlass_tune.grouped_mm(*change(a, b, offs), table=grouped_table(TABLE))


def test_operator_in_a_cuda_graph_replays_new_routing():
    key = register_table(grouped_table(TABLE), key="grouped-gpu-graph")
    a, _, b, offs = operands()
    torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)  # loads the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)
    a.copy_(torch.randn_like(a))
    offs.copy_(torch.tensor((512, 1024, 1536, 2048, 2560, 3072, 3584, 4096), device="cuda", dtype=torch.int32))
    graph.replay()
    close(out, torch._grouped_mm(a, b, offs))


def test_direct_call_in_a_cuda_graph_and_after_it():
    """Guards the kept workspace: a capture takes its own, and eager calls around it stay right."""
    table = grouped_table(TABLE)
    a, _, b, offs = operands()
    before = cutlass_tune.grouped_mm(a, b, offs, table=table)  # kept workspace, instance initialized
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cutlass_tune.grouped_mm(a, b, offs, table=table)
    offs.copy_(torch.tensor((512, 1024, 1536, 2048, 2560, 3072, 3584, 4096), device="cuda", dtype=torch.int32))
    graph.replay()
    close(out, torch._grouped_mm(a, b, offs))
    close(cutlass_tune.grouped_mm(a, b, offs, table=table), torch._grouped_mm(a, b, offs))
    assert before.shape == out.shape


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_operator_under_torch_compile(mode):
    key = register_table(grouped_table(TABLE), key="grouped-gpu-compile")
    a, _, b, offs = operands()
    compiled = torch.compile(lambda a, b, o: torch.ops.cutlass_tune.grouped_mm(a, b, o, key).relu(), fullgraph=True,
                             mode=mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            got = compiled(a, b, offs)
    no_fallback(caught)
    close(got, torch._grouped_mm(a, b, offs).relu())


def test_backward_matches_torch():
    key = register_table(grouped_table(TABLE), key="grouped-gpu-backward")
    a, w, b, offs = operands(grad=True)
    grad = torch.randn(M, N, dtype=torch.bfloat16, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.ops.cutlass_tune.grouped_mm(a, b, offs, key).backward(grad)
    # dA is the table's tt problem of N and K swapped; dB is torch's (the table has no weight-gradient
    # row, said once: test_gpu_grouped_k.py runs a tuned one)
    no_fallback([w for w in caught if "cutlass_tune.grouped_weight_grad" not in str(w.message)])
    got = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = None
    torch._grouped_mm(a, b, offs).backward(grad)
    close(got[0], a.grad)
    close(got[1], w.grad)
    assert not got[1][1].any()  # the expert of no rows


def test_transformers_moe_model_matches_grouped_mm_and_times_both():
    transformers = pytest.importorskip("transformers", minversion="5", reason="needs transformers >= 5")
    import cutlass_tune.transformers as ct

    hidden, inter, experts, top_k, tokens = 1024, 512, 16, 4, 2048
    config = transformers.Qwen3MoeConfig(
        vocab_size=1024, hidden_size=hidden, intermediate_size=2048, moe_intermediate_size=inter,
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=128, num_experts=experts,
        num_experts_per_tok=top_k, max_position_embeddings=4096)
    rows = tokens * top_k
    ct.use_table(grouped_table([(experts, 2 * inter, hidden, rows, Layout.COL), (experts, hidden, inter, rows,
                                                                                 Layout.COL)]))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                          experts_implementation="grouped_mm").cuda().eval()
    ids = torch.randint(0, 1024, (1, tokens), device="cuda")
    times = {}
    with torch.no_grad():
        outputs = {}
        for name in ("grouped_mm", ct.NAME):
            model.set_experts_implementation(name)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outputs[name] = model(ids).logits.float()
            if name == ct.NAME:
                no_fallback(caught)
            times[name] = _median_ms(lambda: model(ids), 20)
    close(outputs[ct.NAME], outputs["grouped_mm"], tol=2e-2)
    print(f"\ntiny Qwen3-MoE forward ({tokens} tokens, {experts} experts, top {top_k}): grouped_mm "
          f"{times['grouped_mm']:.3f} ms, cutlass_tune {times[ct.NAME]:.3f} ms, ratio "
          f"{times['grouped_mm'] / times[ct.NAME]:.3f}")


def _median_ms(fn, n):
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def test_no_routed_rows_give_an_empty_result_like_torch():
    """Guards grouped_problem_of refusing M = 0 (an expert-parallel rank given no tokens)."""
    table = grouped_table(TABLE)
    a, _, b, offs = operands(counts=(0,) * E)
    want = torch._grouped_mm(a, b, offs)
    for got in (cutlass_tune.grouped_mm(a, b, offs, table=table),
                torch.ops.cutlass_tune.grouped_mm(a, b, offs, register_table(table))):
        assert got.shape == want.shape == (0, N) and got.dtype == want.dtype
