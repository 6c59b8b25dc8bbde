"""cutlass_tune.patch: which nn.Linear layers a table covers, what the report says of the rest,
and a patched model that computes what it did."""

import copy
import json

import pandas as pd
import pytest
import torch
from torch import nn

import cutlass_tune
from cutlass_tune.nn import Linear
from cutlass_tune.runtime import BestTable
from cutlass_tune.space import KernelConfig

from .tables import csv_table, tuned_table


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """bf16 tn entries for N=64, K=32 at two Ms; a tt entry for N=48, K=32 (not nn.Linear's
    layout); f16 only in nt."""
    return csv_table(tmp_path_factory.mktemp("patch") / "best.csv",
                     [("bf16", "tn", 128, 64, 32), ("bf16", "tn", 4096, 64, 32), ("bf16", "tt", 128, 48, 32),
                      ("f16", "nt", 128, 64, 32)])


class Block(nn.Module):
    """Linear layers without a bias (a plain table covers them), one of each case."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(32, 64, bias=False, dtype=torch.bfloat16)
        self.k = nn.Linear(32, 48, bias=False, dtype=torch.bfloat16)
        self.odd = nn.Linear(36, 64, bias=False, dtype=torch.bfloat16)
        self.f32 = nn.Linear(32, 64, bias=False)
        self.half = nn.Linear(32, 64, bias=False, dtype=torch.float16)
        self.attn = nn.MultiheadAttention(64, 4, dtype=torch.bfloat16)
        self.tied = self.q


def test_the_report_says_what_was_swapped_and_why_the_rest_was_left(table):
    model = Block()
    report = cutlass_tune.patch(model, table, cuda_only=False)
    decided = {d.name: (d.swapped, d.reason) for d in report.layers}
    assert list(decided) == ["q", "k", "odd", "f32", "half", "attn.out_proj", "tied"]
    assert decided["q"] == decided["tied"] == (True, "bf16 tn N=64, K=32 tuned at M = 128, 4096 (1.05x cuBLAS)")
    assert decided["k"] == (False, "no bf16 tn entry for N=48, K=32 (N x K tuned: 64x32)")
    assert decided["odd"][0] is False and decided["odd"][1].startswith("K=36 is not a multiple of 8")
    assert decided["f32"] == (False, "torch.float32: the tuned kernels take bfloat16 or float16 (cast the model first)")
    assert decided["half"] == (False, "the table has no f16 tn entries (it has tn entries for: bf16)")
    assert decided["attn.out_proj"] == (False, "a subclass of nn.Linear (NonDynamicallyQuantizableLinear): "
                                               "its own forward is kept")
    assert [d.name for d in report.swapped] == ["q", "tied"] and len(report.left) == 5
    q = report.layers[0]
    assert (q.in_features, q.out_features, q.dtype, q.device) == (32, 64, torch.bfloat16, torch.device("cpu"))
    text = str(report)
    assert text.splitlines()[0] == f"cutlass_tune.patch (table {report.table!r}): 2 of 7 Linear layers swapped"
    assert "\n  swapped  q              32->64 bfloat16  bf16 tn N=64, K=32" in text
    assert "\n  left     f32            32->64 float32   torch.float32: " in text


def test_a_patched_model_keeps_its_parameters_state_dict_and_results(table):
    model = Block()
    before = copy.deepcopy(model)
    q_weight = model.q.weight
    cutlass_tune.patch(model, table, cuda_only=False)
    assert type(model.q) is Linear and model.tied is model.q and model.q.weight is q_weight
    assert type(model.k) is nn.Linear and type(model.attn.out_proj) is not Linear
    assert list(model.state_dict()) == list(before.state_dict())
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    assert torch.equal(model.q(x), torch.matmul(x, before.q.weight.t()))
    torch.testing.assert_close(model.q(x), before.q(x), rtol=1.6e-2, atol=1e-2)


def test_layers_off_cuda_are_left_unless_asked(table):
    report = cutlass_tune.patch(Block(), table)
    assert not report.swapped
    assert report.layers[0].reason == "on cpu: the tuned kernels run on CUDA (move the model there first)"


def test_patching_twice_swaps_nothing_more(table):
    model = Block()
    first = cutlass_tune.patch(model, table, cuda_only=False)
    again = cutlass_tune.patch(model, table, cuda_only=False)
    assert not again.swapped and again.table == first.table
    assert again.layers[0].reason == f"already a cutlass_tune.nn.Linear (table {first.table!r})"


def test_the_model_itself_and_a_table_path(table, tmp_path):
    path = tmp_path / "best.csv"
    csv_table(path, [("bf16", "tn", 128, 64, 32)])
    report = cutlass_tune.patch(nn.Linear(32, 64, dtype=torch.bfloat16), str(path), cuda_only=False)
    assert report.layers[0].name == "" and not report.layers[0].swapped
    assert report.layers[0].reason.startswith("the model itself")
    assert cutlass_tune.patch(nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16)), path,
                              cuda_only=False).table == report.table


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_patched_model_on_cuda_matches_the_original_forward_backward_and_compiled():
    torch.manual_seed(0)
    # no bias on the swapped layer: the table's plain entries cover it (a biased one needs bias entries)
    model = nn.Sequential(nn.Linear(1024, 1024, bias=False), nn.GELU(), nn.Linear(1024, 1000)).to("cuda",
                                                                                                 torch.bfloat16)
    original = copy.deepcopy(model)
    # numerics: swap what the table covers, however short its kernels
    report = cutlass_tune.patch(model, tuned_table(), min_ratio=0, min_kernel_us=0)
    assert [(d.name, d.swapped) for d in report.layers] == [("0", True), ("2", False)]
    x = torch.randn(4, 256, 1024, device="cuda", dtype=torch.bfloat16)
    for patched in (model, torch.compile(model, fullgraph=True)):
        got = patched(x)
        got.float().square().mean().backward()
        original(x).float().square().mean().backward()
        for mine, theirs in zip(model.parameters(), original.parameters()):
            assert ((mine.grad.float() - theirs.grad.float()).norm() / theirs.grad.float().norm()).item() < 2e-2
            mine.grad = theirs.grad = None
        want = original(x).float()
        assert ((got.float() - want).norm() / want.norm()).item() < 1e-2


def test_a_layer_whose_tuned_kernels_measured_slower_than_cublas_keeps_torchs_gemm(tmp_path):
    # Guards against patching a model onto kernels its own table shows losing to cuBLAS.
    path = tmp_path / "slow.csv"
    csv_table(path, [("bf16", "tn", 128, 64, 32), ("bf16", "tn", 4096, 64, 32)])
    frame = pd.read_csv(path, dtype=str)
    frame["ratio"] = ["0.97", "0.991"]
    frame.to_csv(path, index=False)
    model = Block()
    report = cutlass_tune.patch(model, BestTable.load(path), cuda_only=False)
    decided = {d.name: (d.swapped, d.reason) for d in report.layers}
    assert decided["q"] == (False, "bf16 tn N=64, K=32: tuned at 0.991x cuBLAS at best, below min_ratio 1.0 "
                                   "(torch's GEMM is kept)")
    assert type(model.q) is nn.Linear
    assert [d.name for d in cutlass_tune.patch(model, BestTable.load(path), cuda_only=False,
                                                 min_ratio=0.99).swapped] == ["q", "tied"]


def _q_decided(tmp_path, **columns):
    """What patch decides for Block's q layer on a one-row table (bf16 tn 128x64x32) with `columns` set."""
    path = tmp_path / "one-row.csv"
    csv_table(path, [("bf16", "tn", 128, 64, 32)])
    frame = pd.read_csv(path, dtype=str).assign(**columns)
    frame.to_csv(path, index=False)
    report = cutlass_tune.patch(Block(), BestTable.load(path), cuda_only=False)
    return {d.name: (d.swapped, d.reason) for d in report.layers}["q"]


@pytest.mark.parametrize(("ratio", "in_model", "swapped"), [("1.05", "0.93", False), ("0.97", "1.06", True)])
def test_a_layers_in_model_ratio_decides_before_its_claim(tmp_path, ratio, in_model, swapped):
    # Guards patch deciding on a sweep's claim where tune-model measured the kernel inside the model.
    swapped_q, reason = _q_decided(tmp_path, ratio=ratio, strongest_ratio=ratio, in_model_ratio=in_model)
    assert swapped_q is swapped
    if not swapped:
        assert f"tuned at {float(in_model):.3f}x cuBLAS at best, below min_ratio 1.0" in reason


@pytest.mark.parametrize(("method", "in_model", "swapped"), [("events", "", False), ("events", "1.06", True),
                                                        ("sustained", "", True)])
def test_a_layer_is_not_swapped_on_single_launches_alone(tmp_path, method, in_model, swapped):
    # Guards patch deciding on a sweep's single launches (issue 46), as the dispatcher does not.
    swapped_q, reason = _q_decided(tmp_path, ratio="1.2", strongest_ratio="1.2", method=method,
                                   in_model_ratio=in_model)
    assert swapped_q is swapped
    if not swapped:
        assert "no ratio to cuBLAS to hold to min_ratio 1.0 (a sweep's single launches alone" in reason


def test_fused_entries_do_not_cover_a_plain_layer(tmp_path):
    # Guards against patch swapping a layer for rows of a bias+silu kernel: nn.Linear's GEMM
    # would find no plain kernel and the report would claim that kernel's ratio.
    path = tmp_path / "best.csv"
    csv_table(path, [("bf16", "tn", 128, 64, 32)])
    frame = pd.read_csv(path, dtype=str)
    frame["epilogue"], frame["scaling"] = "bias+silu", "none"
    frame["torch_compile_tflops"] = frame["torch_compile_ratio"] = ""
    config = frame.loc[0, "config"].replace('"dtype_a"', '"epilogue": "bias+silu", "dtype_a"')
    frame["config"] = config
    frame["config_hash"] = KernelConfig.from_dict(json.loads(config)).hash
    frame.to_csv(path, index=False)
    model = nn.Sequential(nn.Linear(32, 64, bias=False, dtype=torch.bfloat16))
    report = cutlass_tune.patch(model, BestTable.load(path), cuda_only=False)
    assert not report.swapped
    assert report.layers[0].reason == "the table has no bf16 tn entries (it has tn entries for: none)"


def test_a_layer_whose_kernels_are_shorter_than_a_calls_host_time_keeps_torchs_gemm(tmp_path):
    # Guards against a patch slowing a host-bound model: BERT-large at 8192 tokens ran 0.53x
    # with its 29 us projections swapped, the Python call path costing more than the kernel.
    path = tmp_path / "short.csv"
    csv_table(path, [("bf16", "tn", 128, 64, 32), ("bf16", "tn", 4096, 64, 32)])
    frame = pd.read_csv(path, dtype=str)
    frame["ratio"], frame["median_ms"] = "1.2", ["0.004", "0.029"]
    frame.to_csv(path, index=False)
    model = Block()
    report = cutlass_tune.patch(model, BestTable.load(path), cuda_only=False)
    decided = {d.name: (d.swapped, d.reason) for d in report.layers}
    assert decided["q"] == (False, "bf16 tn N=64, K=32: its kernel takes 29 us at M = 4096, under min_kernel_us 150, "
                                   "the host time of a call (torch's GEMM is kept; under CUDA graphs the host drops "
                                   "out: pass min_kernel_us=0)")
    assert type(model.q) is nn.Linear
    assert [d.name for d in cutlass_tune.patch(model, BestTable.load(path), cuda_only=False,
                                                 min_kernel_us=0).swapped] == ["q", "tied"]
    frame["median_ms"] = ["0.004", "0.2"]  # one entry long enough: its M is the model's, the layer is swapped
    frame.to_csv(path, index=False)
    assert [d.name for d in cutlass_tune.patch(Block(), BestTable.load(path), cuda_only=False).swapped] == ["q", "tied"]


def _bias_table(path, ratio="1.05"):
    """bf16 tn `bias` entries (the GEMM with the bias in its epilogue) for N=64, K=32."""
    csv_table(path, [("bf16", "tn", 128, 64, 32)])
    frame = pd.read_csv(path, dtype=str)
    frame["epilogue"], frame["scaling"], frame["ratio"] = "bias", "none", ratio
    config = frame.loc[0, "config"].replace('"dtype_a"', '"epilogue": "bias", "dtype_a"')
    frame["config"], frame["config_hash"] = config, KernelConfig.from_dict(json.loads(config)).hash
    frame.to_csv(path, index=False)
    return BestTable.load(path)


def test_a_layer_with_a_bias_needs_bias_entries_and_runs_the_fused_bias(table, tmp_path):
    # Guards against a swap that runs the tuned GEMM and then torch's bias add, a pass over the
    # output more than F.linear (whose cuBLASLt call adds the bias in its epilogue) makes, on the
    # strength of a plain entry measured against a plain cuBLAS GEMM.
    plain = nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16))
    report = cutlass_tune.patch(plain, table, cuda_only=False)
    assert not report.swapped
    assert report.layers[0].reason == (
        "the table has no tn bias entries; its plain entries do not count for a Linear with a bias, which F.linear "
        "adds in cuBLASLt's epilogue (tune the bias problems `cutlass-tune shapes` records)")
    model = nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16))
    before = copy.deepcopy(model)
    report = cutlass_tune.patch(model, _bias_table(tmp_path / "bias.csv"), cuda_only=False)
    assert [d.name for d in report.swapped] == ["0"]
    assert report.layers[0].reason == "bf16 tn bias N=64, K=32 tuned at M = 128 (1.05x torch)"
    assert type(model[0]) is Linear and model[0].fused_bias and "fused_bias=True" in repr(model[0])
    x = torch.randn(3, 32, dtype=torch.bfloat16, requires_grad=True)
    torch.testing.assert_close(model(x), before(x), rtol=1.6e-2, atol=1e-2)
    model(x).float().sum().backward()  # the operator's backward: the bias's gradient is the rows' sum
    torch.testing.assert_close(model[0].bias.grad.float(), torch.full((64,), 3.0))
    slow = cutlass_tune.patch(nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16)),
                              _bias_table(tmp_path / "slow.csv", "0.98"), cuda_only=False)
    assert slow.layers[0].reason == ("bf16 tn bias N=64, K=32: tuned at 0.980x torch at best, below min_ratio 1.0 "
                                     "(torch's path is kept)")
