"""`cutlass-tune shapes`: the GEMMs of a model as space files (cutlass_tune/capture.py), on the
meta device, so on any CPU."""

import signal
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from cutlass_tune import cli
from cutlass_tune.capture import Target, capture_gemms, load_target, space_files
from cutlass_tune.space import Activation, DType, Epilogue, Layout, Pair, Problem, Scaling, layout_code, load_space

from .cli_run import cli as run_cli

REPO = Path(__file__).resolve().parents[1]
ROW, COL = Layout.ROW, Layout.COL
BF16 = DType.BF16

MLP = """
import torch
from torch import nn


def build():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32, bias=False)).to(torch.bfloat16)
    return model, (torch.randn(2, 8, 64, dtype=torch.bfloat16),)
"""
"""Two nn.Linear layers on real weights (moved to meta for the capture); 2 x 8 tokens, M = 16."""

DECODER = """
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * self.weight


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class GatedMLP(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.self_attn, self.mlp = Attention(d, heads, kv_heads), GatedMLP(d, ffn)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, vocab=1024, d=256, heads=4, kv_heads=2, ffn=512, layers=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.head_dim = d // heads

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=x.device, dtype=torch.float32)
        inv_freq = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2, device=x.device) / self.head_dim)
        angles = torch.cat([positions[:, None] * inv_freq[None, :]] * 2, dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return {"logits": self.lm_head(self.norm(x))}


def build():
    with torch.device("meta"):
        model = Decoder().to(torch.bfloat16)
    return model, {"input_ids": torch.zeros(2, 16, dtype=torch.long)}
"""
"""A Llama-style decoder (transformers' layout: q/k/v/o projections with grouped KV heads,
rotary positions, SDPA, a gated MLP, an untied head), built on meta: 2 x 16 tokens, M = 32."""


def model_file(tmp_path, source, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def target(model, *args, **kwargs):
    return Target("test", Path("test.py"), model, args, kwargs)


def tn(m, n, k, dtype=BF16, out=None, epilogue="none", scaling=Scaling.NONE):
    return Problem(m, n, k, dtype_a=dtype, dtype_b=dtype, dtype_d=out or dtype, layout_a=ROW, layout_b=COL,
                   epilogue=Epilogue.parse(epilogue), scaling=scaling)


def test_linear_layers_are_tn_problems_counted_by_call(tmp_path):
    captured = capture_gemms(load_target(f"{model_file(tmp_path, MLP)}:build"))
    # Linear(64, 128) with its bias, then ReLU: one GEMM with a fused epilogue
    assert captured.problems() == {tn(16, 128, 64, epilogue="bias+relu"): {"aten.addmm": 1},
                                   tn(16, 32, 128): {"aten.mm": 1}}
    assert captured.skipped() == []


def test_the_backward_adds_dx_as_tt_and_dw_as_nt(tmp_path):
    # y = x @ W.t() is an M x N x K "tn" GEMM (W stored N x K). dX = dY @ W is M x K x N whose B,
    # W itself, is row-major: "tt". dW = dY.t() @ x is N x K x M whose A, dY.t(), is column-major and
    # B, x, row-major: "nt". The first layer's input asks no gradient: no dX there. (Started from
    # sum().backward(), dY would be a stride-0 expansion and layer 2's dX skipped as strided.)
    captured = capture_gemms(load_target(f"{model_file(tmp_path, MLP)}:build"), backward=True)
    backward = {p: s for p, s in captured.problems().items() if s == {"aten.mm (backward)": 1}}
    assert list(backward) == [Problem(32, 128, 16, layout_a=COL, layout_b=ROW),  # dW of layer 2
                              Problem(16, 128, 32, layout_a=ROW, layout_b=ROW),  # dX of layer 2
                              Problem(128, 64, 16, layout_a=COL, layout_b=ROW)]  # dW of layer 1
    assert len(captured.problems()) == 5


def test_an_input_that_asks_for_a_gradient_gets_its_dx():
    linear = nn.Linear(64, 32, bias=False, device="meta", dtype=torch.bfloat16)
    x = torch.empty(16, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    captured = capture_gemms(target(linear, x), backward=True)
    assert [p.name for p in captured.problems()] == ["16x32x64_bf16bf16bf16_tn", "32x64x16_bf16bf16bf16_nt",
                                                     "16x64x32_bf16bf16bf16_tt"]


def test_a_decoder_on_meta_gives_its_projections(tmp_path):
    captured = capture_gemms(load_target(f"{model_file(tmp_path, DECODER)}:build"))
    m = 2 * 16
    assert captured.problems() == {
        tn(m, 256, 256): {"aten.mm": 2},  # q_proj, two layers
        tn(m, 128, 256): {"aten.mm": 4},  # k_proj and v_proj (2 KV heads of 64)
        tn(m, 256, 256, epilogue="residual"): {"aten.mm": 2},  # o_proj, added to the residual stream
        tn(m, 512, 256): {"aten.mm": 2},  # gate_proj: its SiLU goes into up_proj's gated epilogue
        tn(m, 512, 256, epilogue="silu+gated"): {"aten.mm": 2},  # up_proj, gated by silu(gate_proj(x))
        tn(m, 256, 512, epilogue="residual"): {"aten.mm": 2},  # down_proj, added to the residual stream
        tn(m, 1024, 256): {"aten.mm": 1},  # lm_head
    }
    # attention's own products (scores and values) are batched over heads: listed, not written
    assert captured.skipped() and all(c.op == "bmm" and c.skipped.startswith("batched") and c.problem is None
                                      for c, _ in captured.skipped())


def test_a_decoder_backward_has_a_dx_and_a_dw_for_every_projection(tmp_path):
    captured = capture_gemms(load_target(f"{model_file(tmp_path, DECODER)}:build"), backward=True)
    by_layout: dict[str, set] = {}
    for p in captured.problems():
        by_layout.setdefault(layout_code(p.layout_a, p.layout_b), set()).add((p.m, p.n, p.k))
    forward = by_layout["tn"]
    assert by_layout["tt"] == {(m, k, n) for m, n, k in forward}
    assert by_layout["nt"] == {(n, k, m) for m, n, k in forward}


@pytest.mark.gpu
def test_on_a_gpu_a_decoder_runs_the_gemms_it_runs_on_meta(tmp_path):
    # The backward's GEMMs run on the autograd engine's device thread: the mode must reach it there.
    build = load_target(f"{model_file(tmp_path, DECODER)}:build")
    on_meta = capture_gemms(build, backward=True).problems()
    assert capture_gemms(build, backward=True, device="cuda").problems() == on_meta


def test_a_bmm_over_a_shared_b_is_one_gemm_and_attention_is_skipped():
    a = torch.empty(4, 32, 64, device="meta", dtype=torch.bfloat16)
    w = torch.empty(128, 64, device="meta", dtype=torch.bfloat16)
    shared = w.t().expand(4, 64, 128)
    own = torch.empty(4, 64, 128, device="meta", dtype=torch.bfloat16)

    def model(a, w):
        torch.bmm(a, shared)  # x @ w.t() per batch: one (4 * 32) x 128 x 64 GEMM
        torch.bmm(a, own)  # a B per batch
        torch.bmm(a.transpose(0, 1).contiguous().transpose(0, 1), shared)  # A rows not one matrix
        return a

    calls = list(capture_gemms(target(model, a, w)).calls)
    assert calls[0].problem == tn(128, 128, 64) and calls[0].skipped is None
    assert calls[1].shape == "4 x 32x128x64 bfloat16/bfloat16/bfloat16" and calls[1].skipped.startswith("batched")
    assert calls[2].problem is None and "not one 128x64 matrix" in calls[2].skipped


def test_what_the_kernels_cannot_take_is_skipped_with_the_reason():
    x = torch.empty(16, 128, device="meta", dtype=torch.bfloat16)
    f32 = nn.Linear(128, 64, device="meta")
    odd = nn.Linear(128, 100, bias=False, device="meta", dtype=torch.bfloat16)
    w = torch.empty(64, 64, device="meta", dtype=torch.bfloat16)

    def model(x):
        f32(x.float())
        odd(x)
        torch.mm(x[:, :64], w)  # A is a slice: rows 128 apart, 64 long
        return x

    reasons = [c.skipped for c in capture_gemms(target(model, x)).calls]
    assert reasons[0].startswith("dtype_inputs: A and B must both be bf16")
    assert reasons[1].startswith("tma_alignment: N=100 is not a multiple of 8")
    assert reasons[2] == "A (16x64, strides (128, 1)) is neither row- nor column-major contiguous"


class Fp8Linear(nn.Module):
    def __init__(self, k, n, out_dtype=torch.bfloat16):
        super().__init__()
        self.register_buffer("weight", torch.empty(n, k, dtype=torch.float8_e4m3fn))
        self.out_dtype = out_dtype

    def forward(self, x):
        one = torch.ones((), device=x.device)
        return torch._scaled_mm(x.to(torch.float8_e4m3fn), self.weight.t(), one, one, out_dtype=self.out_dtype)


def test_fp8_and_16_bit_gemms_go_to_one_space_file_each(tmp_path):
    x = torch.empty(64, 256, device="meta", dtype=torch.bfloat16)
    fp8, fp8_out = Fp8Linear(256, 512), Fp8Linear(256, 512, out_dtype=torch.float8_e4m3fn)
    bf16 = nn.Linear(512, 256, bias=False, device="meta", dtype=torch.bfloat16)
    captured = capture_gemms(target(lambda x: (fp8_out(x), bf16(fp8(x)))[1], x))
    assert captured.skipped()[0][0].skipped.startswith("dtype_output: D must be bf16, f16 or f32")
    files = space_files(captured, tmp_path / "gemms.yaml", "test")
    assert [(f.path.name, f.group) for f in files] == [("gemms_e4m3-bf16_tn.yaml", "e4m3->bf16 tn"),
                                                      ("gemms_bf16_tn.yaml", "bf16 tn")]
    for f in files:
        f.path.write_text(f.text)
    fp8_space, bf16_space = (load_space(f.path) for f in files)
    assert fp8_space.problems == (tn(64, 512, 256, DType.E4M3, DType.BF16, scaling=Scaling.TENSOR),)
    assert bf16_space.problems == (tn(64, 256, 512),)
    assert yaml.safe_load(files[0].text)["kernels"] == yaml.safe_load((REPO / "configs/squares_fp8.yaml").read_text())[
        "kernels"]


def test_the_written_space_has_the_broad_kernels_and_counts_the_calls(tmp_path):
    captured = capture_gemms(load_target(f"{model_file(tmp_path, DECODER)}:build"))
    (written,) = space_files(captured, tmp_path / "decoder.yaml", "decoder.py:build")
    assert written.path == tmp_path / "decoder.yaml"
    assert "  - {m: 32, n: 128, k: 256}  # 4 calls: aten.mm\n" in written.text
    written.path.write_text(written.text)
    space = load_space(written.path)
    broad = load_space(REPO / "configs" / "sm90_bf16.yaml")
    assert "  - {m: 32, n: 512, k: 256, epilogue: silu+gated}  # 2 calls: aten.mm\n" in written.text
    assert space.problems == tuple(captured.problems())
    # the broad kernels for each kind of problem: the plain GEMMs, the gated and the residual ones
    plain = tuple(c for c in space.candidates if c.epilogue == Epilogue())
    assert plain == broad.candidates and space.runtime == broad.runtime
    assert len(space.candidates) == 3 * len(plain)
    assert {c.epilogue.name for c in space.candidates} == {"none", "silu+gated", "residual"}


# The command, in this process: main() as the console script runs it (one line and exit 2 for
# bad input), without starting torch again for each case.

def shapes(monkeypatch, capsys, *args):
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # main() installs handlers for the process
    monkeypatch.setattr(sys, "argv", ["cutlass-tune", "shapes", *map(str, args)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def error_line(result):
    code, out, err = result
    assert (code, out, len(err.splitlines())) == (2, "", 1), err
    assert err.startswith("error: ")
    return err.strip()


def test_the_command_writes_a_file_per_layout_with_backward(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model_file(tmp_path, MLP)
    code, out, err = shapes(monkeypatch, capsys, "model.py:build", "--backward")
    assert (code, err) == (0, "")
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == [
        "model_gemms_bf16_nt.yaml", "model_gemms_bf16_tn.yaml", "model_gemms_bf16_tt.yaml"]
    assert load_space(tmp_path / "model_gemms_bf16_tt.yaml").problems == (Problem(16, 128, 32, layout_b=ROW),)
    assert ["16x128x32_bf16bf16bf16_tt", "1", "aten.mm", "(backward)"] in [line.split() for line in out.splitlines()]
    assert "wrote model_gemms_bf16_nt.yaml: 2 bf16 nt problems" in out


@pytest.mark.parametrize("spec, source, expected", [
    ("missing.py:build", None, "error: missing.py: no such file"),
    ("model.py", MLP, "error: 'model.py': give the model as FILE.py:FUNCTION"),
    ("model.py:make", MLP, "error: model.py has no function 'make'"),
    ("model.py:build", "import nowhere_to_be_found\n",
     "error: model.py: importing it raised ModuleNotFoundError: No module named 'nowhere_to_be_found'"),
    ("model.py:build", "def build():\n    raise ValueError('no such size\\nsecond line')\n",
     "error: model.py:build() raised ValueError: no such size"),
    ("model.py:build", "import torch\ndef build():\n    return torch.nn.Linear(8, 8)\n",
     "error: model.py:build() returned a Linear: return (model, example_inputs)"),
    ("model.py:build", "import torch\ndef build():\n    return torch.nn.Linear(8, 8), torch.ones(8)\n",
     "error: model.py:build(): example_inputs is a Tensor: give a tuple or list"),
    ("model.py:build", "import torch\ndef build():\n    return torch.nn.ReLU(), (torch.ones(8),)\n",
     "error: model.py:build: the model ran no GEMM (aten.mm, aten.addmm"),
    ("model.py:build", "import torch\ndef build():\n    return torch.nn.Linear(8, 8), (torch.ones(8),)\n",
     "error: model.py:build: no GEMM the tuned kernels can take: 1 call, all skipped (first: "
     "1x8x8_f32f32f32_tn_bias aten.addmm: dtype_inputs: A and B must both be bf16"),
    ("model.py:build", "import torch\ndef build():\n    return (lambda x: x[0].item()), (torch.ones(8),)\n",
     "error: model.py:build: the model raised RuntimeError: Tensor.item() cannot be called on meta tensors on "
     "meta (a model that reads tensor values needs --device cuda)"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, spec, source, expected):
    monkeypatch.chdir(tmp_path)
    if source is not None:
        model_file(tmp_path, source)
    assert error_line(shapes(monkeypatch, capsys, spec)).startswith(expected)
    assert not list(tmp_path.glob("*.yaml"))


def test_backward_needs_an_output_with_a_gradient(tmp_path, monkeypatch, capsys):
    model_file(tmp_path, MLP.replace("return model,", "model.requires_grad_(False)\n    return model,"))
    line = error_line(shapes(monkeypatch, capsys, tmp_path / "model.py:build", "--backward",
                             "-o", tmp_path / "out.yaml"))
    assert line.endswith("--backward: no floating output requires grad (frozen parameters, or a forward under "
                         "no_grad)")


@pytest.mark.parametrize("output, expected", [
    ("sub", "-o sub: is a folder"),
    (".", "-o '.': give a file name"),
    ("plain/gemms.yaml", "plain is a file, not a folder"),
    ("model.py", "-o model.py is the file the results are read from"),
])
def test_an_output_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys, output, expected):
    monkeypatch.chdir(tmp_path)
    model_file(tmp_path, MLP)
    (tmp_path / "plain").write_text("x")
    (tmp_path / "sub").mkdir()
    assert expected in error_line(shapes(monkeypatch, capsys, "model.py:build", "-o", output))
    assert (tmp_path / "model.py").read_text() == textwrap.dedent(MLP)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a host without a GPU is told")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path, monkeypatch, capsys):
    model_file(tmp_path, MLP)
    line = error_line(shapes(monkeypatch, capsys, tmp_path / "model.py:build", "--device", "cuda",
                             "-o", tmp_path / "out.yaml"))
    assert line == "error: --device cuda: no CUDA GPU is visible (the default --device meta needs none)"


# The command as the console script: a real process, and the written file through `space`.

def run(*args, cwd):
    return run_cli(*args, cwd=cwd)  # in this process: the command's output and exit code


def test_the_written_space_file_expands_with_the_space_command(tmp_path):
    model_file(tmp_path, DECODER, "decoder.py")
    r = run("shapes", "decoder.py:build", "-o", "decoder.yaml", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["problem", "calls", "source"]
    assert lines[1].split() == ["32x256x256_bf16bf16bf16_tn", "2", "aten.mm"]
    assert lines[3].split() == ["32x256x256_bf16bf16bf16_tn_residual", "2", "aten.mm"]  # o_proj into the residual
    assert any(line.startswith("skipped") for line in lines)
    # up_proj gated by gate_proj and the two residual adds are problems of their own, with the broad kernels again
    assert lines[-1].startswith("wrote decoder.yaml: 7 bf16 tn problems, 2700 valid configs; tune them with "
                                "`cutlass-tune sweep decoder.yaml`")
    r = run("space", "decoder.yaml", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("decoder.yaml: 7 problems, 11664 configs: 2700 valid")


def test_a_failing_function_is_one_line_in_a_real_process(tmp_path):
    model_file(tmp_path, "def build():\n    raise KeyError('vocab')\n")
    r = run("shapes", "model.py:build", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "error: model.py:build() raised KeyError: 'vocab'\n")


# ---- epilogues -------------------------------------------------------------------------------
def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_bias_activation_and_residual_become_the_problems_epilogue():
    x, w, c = meta(64, 128), meta(256, 128), meta(64, 256)
    up = nn.Linear(128, 256, device="meta", dtype=torch.bfloat16)

    def model(x):
        torch.nn.functional.gelu(up(x), approximate="tanh")  # linear's addmm, then GELU in its tanh form
        torch.relu(torch.addmm(c, x, w.t()))  # a full C: residual
        torch._addmm_activation(up.bias, x, w.t(), use_gelu=True)  # cuBLASLt's bias + GELU epilogue
        torch.nn.functional.silu(x @ w.t())
        return x

    assert capture_gemms(target(model, x)).problems() == {
        tn(64, 256, 128, epilogue="bias+gelu_tanh"): {"aten.addmm": 1, "aten._addmm_activation": 1},
        tn(64, 256, 128, epilogue="relu+residual"): {"aten.addmm": 1},
        tn(64, 256, 128, epilogue="silu"): {"aten.mm": 1}}


def test_an_activation_that_is_not_next_on_the_output_stays_out():
    """Guards against fusing an activation into a GEMM whose raw output is read first."""
    x, w = meta(64, 128), meta(256, 128)

    def model(x):
        y = x @ w.t()
        z = y * 2  # reads the GEMM's output before the activation
        return torch.relu(y) + z

    assert list(capture_gemms(target(model, x)).problems()) == [tn(64, 256, 128)]


def test_scaled_mm_gives_its_scaling_and_bias():
    x, w = meta(64, 256, dtype=torch.float8_e4m3fn), meta(512, 256, dtype=torch.float8_e4m3fn)
    rows, cols, bias = meta(64, 1, dtype=torch.float32), meta(1, 512, dtype=torch.float32), meta(512)
    blocks_a, blocks_b = meta(64, 2, dtype=torch.float32), meta(2, 512, dtype=torch.float32)

    def model(x):
        torch._scaled_mm(x, w.t(), rows, cols, bias=bias, out_dtype=torch.bfloat16)
        torch._scaled_mm(x, w.t(), blocks_a, blocks_b, out_dtype=torch.bfloat16)  # 1x128 blocks
        return x

    captured = capture_gemms(target(model, x))
    e4m3 = dict(dtype=DType.E4M3, out=DType.BF16)
    assert list(captured.problems()) == [tn(64, 512, 256, **e4m3, epilogue="bias", scaling=Scaling.ROWCOL)]
    ((skipped, _),) = captured.skipped()
    assert skipped.skipped == "scales (64, 2) x (2, 512): neither per tensor nor per row x per column"


def test_written_space_gives_each_problem_its_epilogue(tmp_path):
    x = meta(64, 128)
    up = nn.Linear(128, 256, device="meta", dtype=torch.bfloat16)
    captured = capture_gemms(target(lambda x: torch.nn.functional.silu(up(x)) + up(x), x))
    (written,) = space_files(captured, tmp_path / "gemms.yaml", "test")
    assert "  - {m: 64, n: 256, k: 128, epilogue: bias+silu}  # 1 call: aten.addmm\n" in written.text
    written.path.write_text(written.text)
    assert load_space(written.path).problems == (tn(64, 256, 128, epilogue="bias+silu"),
                                                 tn(64, 256, 128, epilogue="bias+residual"))
    assert Activation.SILU is load_space(written.path).problems[0].epilogue.activation


class _Experts(nn.Module):
    """MoE experts as transformers' "grouped_mm" runs them: routed rows sorted by expert, a gate_up
    stack (E x 2I x H) and a down stack (E x H x I), torch._grouped_mm on their transposes; with
    `contiguous`, stacks of the other layout (E x H x 2I and E x I x H) taken as they are."""

    def __init__(self, experts=8, hidden=64, inter=32, top_k=2, grouped=torch._grouped_mm, contiguous=False):
        super().__init__()
        self.top_k, self.experts, self.grouped, self.contiguous = top_k, experts, grouped, contiguous
        self.router = nn.Linear(hidden, experts, bias=False)
        gate_up, down = (experts, 2 * inter, hidden), (experts, hidden, inter)
        if contiguous:
            gate_up, down = (experts, hidden, 2 * inter), (experts, inter, hidden)
        self.gate_up = nn.Parameter(torch.randn(gate_up) / 8)
        self.down = nn.Parameter(torch.randn(down) / 8)

    def _weights(self, w):
        return w if self.contiguous else w.transpose(-2, -1)

    def forward(self, x):
        x = x.reshape(-1, x.shape[-1])
        ids = self.router(x).topk(self.top_k, dim=-1).indices.reshape(-1)
        ids, perm = torch.sort(ids)
        rows = x[perm // self.top_k]
        counts = torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        gate, up = self.grouped(rows, self._weights(self.gate_up), offs).chunk(2, dim=-1)
        return self.grouped(torch.nn.functional.silu(gate) * up, self._weights(self.down), offs)


def test_moe_experts_are_grouped_problems_in_a_file_of_their_own(tmp_path):
    model = _Experts().to(torch.bfloat16)
    captured = capture_gemms(target(model, torch.randn(2, 8, 64, dtype=torch.bfloat16)))
    grouped = [p for p in captured.problems() if p.grouped and p.epilogue.is_plain]
    assert [(p.groups, p.n, p.k, p.m, p.layout) for p in grouped] == [(8, 64, 64, 32, "tn"), (8, 64, 32, 32, "tn")]
    files = space_files(captured, tmp_path / "moe.yaml", "moe.py:build")
    assert [f.path.name for f in files] == ["moe_bf16_tn.yaml", "moe_bf16_tn_grouped.yaml",
                                           "moe_bf16_tn_grouped_glu.yaml"]
    problems = yaml.safe_load(files[1].text)["problems"]
    assert problems == [{"experts": 8, "n": 64, "k": 64, "rows": 32, "routing": "uniform"},
                        {"experts": 8, "n": 64, "k": 32, "rows": 32, "routing": "uniform"}]
    assert "{experts: 8, n: 64, k: 64, rows: 32, routing: uniform}  # 1 call: aten._grouped_mm" in files[1].text


def test_a_gated_pair_after_a_grouped_gemm_is_recorded_as_its_glu_twin(tmp_path):
    """The gate_up GEMM whose halves make silu(gate) * up is recorded plain and as the GLU problem
    the layer's GLU stage looks up, in a space file of its own whose kernels a GLU pair runs."""
    model = _Experts().to(torch.bfloat16)
    captured = capture_gemms(target(model, torch.randn(2, 8, 64, dtype=torch.bfloat16)))
    glu = {p: s for p, s in captured.problems().items() if p.epilogue.pair is not Pair.NONE}
    assert [(p.groups, p.n, p.k, p.m, p.epilogue.name) for p in glu] == [(8, 64, 64, 32, "silu+glu")]
    assert list(glu.values()) == [{"aten._grouped_mm + silu(gate) * up": 1}]
    (path, text) = [(f.path.name, f.text) for f in space_files(captured, tmp_path / "moe.yaml", "moe.py:build")][2]
    space = yaml.safe_load(text)
    assert path == "moe_bf16_tn_grouped_glu.yaml"
    assert space["problems"] == [{"experts": 8, "n": 64, "k": 64, "rows": 32, "routing": "uniform",
                                  "epilogue": "silu+glu"}]
    assert space["kernels"]["epilogue_schedule"] == ["no_smem"] and space["kernels"]["epilogue_source"] == [False]
    (tmp_path / path).write_text(text)
    sp = load_space(tmp_path / path)
    assert [p.name for p in sp.problems] == [next(iter(glu)).name] and len(sp.valid) > 0
    from cutlass_tune.runtime import _moe, _moe_glu  # the problem the layer's GLU stage looks up

    layout = _moe.experts_layout(model.gate_up, model.down, "silu", transposed=False)
    assert _moe_glu.glu_problem(layout, torch.bfloat16, 32).name == next(iter(glu)).name


@pytest.mark.parametrize("between", ["slices", "no-product", "backward"])
def test_no_glu_twin_without_the_gated_pair_of_the_forward(between):
    """Only act(gate) * up of the two halves makes the twin: the halves taken by slices do too, an
    activation alone does not, and a training capture records none (no GLU stage under autograd)."""

    class Sliced(_Experts):
        def forward(self, x):
            x = x.reshape(-1, x.shape[-1])
            ids, perm = torch.sort(self.router(x).topk(self.top_k, dim=-1).indices.reshape(-1))
            offs = torch.cumsum(torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1), 0,
                                dtype=torch.int32)
            h = torch._grouped_mm(x[perm // self.top_k], self.gate_up.transpose(-2, -1), offs)
            n = h.shape[-1] // 2
            mixed = torch.nn.functional.silu(h[:, :n]) * h[:, n:] if between != "no-product" \
                else torch.nn.functional.silu(h[:, :n]) + h[:, n:]
            return torch._grouped_mm(mixed, self.down.transpose(-2, -1), offs)

    model = Sliced().to(torch.bfloat16)
    captured = capture_gemms(target(model, torch.randn(2, 8, 64, dtype=torch.bfloat16)),
                             backward=between == "backward")
    glu = [p.name for p in captured.problems() if p.epilogue.pair is not Pair.NONE]
    assert glu == (["32x64x64_bf16bf16bf16_tn_grouped_silu+glu_e8-uniform"] if between == "slices" else [])


def _operator(a, b, offs):
    return torch.ops.cutlass_tune.grouped_mm(a, b, offs, "capture-experts")


@pytest.fixture
def operator_table():
    """An empty table under the key `_operator` calls with: on meta only the operator's fake runs."""
    import pandas as pd

    from cutlass_tune.runtime import BestTable, register_table

    register_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), key="capture-experts")


def _training_problems(captured):
    """The grouped problems of a capture: (grouping, E, N, K, rows, layout, backward)."""
    return {(p.grouping.value, p.groups, p.n, p.k, p.m, p.layout, any(s.endswith("(backward)") for s in sources))
            for p, sources in captured.problems().items() if p.grouped}


@pytest.mark.parametrize("grouped", ["aten", "operator"])
@pytest.mark.parametrize("contiguous", [False, True], ids=["linear-stacks", "contiguous-stacks"])
def test_moe_backward_records_the_forward_input_and_weight_gradients(grouped, contiguous, request):
    """Guards `shapes --backward` on MoE experts: the weight gradients are grouped-k problems, not skipped."""
    if grouped == "operator":
        request.getfixturevalue("operator_table")
    # 4 experts, hidden 64, intermediate 40 (gate_up 80 wide): N and K of each GEMM differ
    model = _Experts(experts=4, inter=40, contiguous=contiguous,
                     grouped=_operator if grouped == "operator" else torch._grouped_mm).to(torch.bfloat16)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    captured = capture_gemms(target(model, x), backward=True)
    forward, input_grad = ("tt", "tn") if contiguous else ("tn", "tt")
    rows = 2 * 8 * 2  # tokens x top-k
    # dW of gate_up and down, E x N x K as the call computes it: an nn.Linear-style stack's own
    # shape, a contiguous E x K x N stack's (its gradient is G = the input rows, X = dY)
    weights = [(64, 80), (40, 64)] if contiguous else [(80, 64), (64, 40)]
    assert _training_problems(captured) == {
        ("grouped", 4, 80, 64, rows, forward, False), ("grouped", 4, 64, 40, rows, forward, False),
        ("grouped", 4, 64, 80, rows, input_grad, True), ("grouped", 4, 40, 64, rows, input_grad, True),
        *(("grouped-k", 4, n, k, rows, "nt", True) for n, k in weights)}
    op = "grouped_weight_grad" if grouped == "operator" else "_grouped_mm"
    assert not [c for c, _ in captured.skipped() if c.op in (op, "grouped_mm")]


def test_grouped_calls_no_kernel_takes_are_skipped_with_the_reason():
    offs = torch.empty(4, dtype=torch.int32, device="meta")

    def model(x):
        torch._grouped_mm(meta(48, 32).t(), meta(48, 64), offs)  # G^T of a row-major G: a weight gradient
        torch._grouped_mm(meta(32, 48), meta(48, 64), offs)  # G^T stored row-major: G is column-major
        torch._grouped_mm(meta(4, 48, 32), meta(32, 64), offs)  # 3-D x 2-D
        return x

    captured = capture_gemms(target(model, meta(1)))
    assert [(p.grouping.value, p.groups, p.n, p.k, p.m, p.layout) for p in captured.problems()] == [
        ("grouped-k", 4, 32, 64, 48, "nt")]
    assert [c.skipped.split(":")[0] for c, _ in captured.skipped()] == [
        "operands G of strides (1, 48) and X of strides (64, 1)", "a 3-D x 2-D grouped GEMM"]


def test_a_training_steps_weight_gradients_round_trip_through_the_space_file(tmp_path, monkeypatch):
    """Guards the written grouped-k file: `space` lists its problems valid and `sweep` plans it."""
    model = _Experts(experts=4, inter=40).to(torch.bfloat16)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    captured = capture_gemms(target(model, x), backward=True)
    files = space_files(captured, tmp_path / "train.yaml", "moe.py:build", backward=True)
    # the forward's, the weight gradients' and the input gradients' (the router's 4-wide GEMM is skipped)
    assert [f.path.name for f in files] == ["train_bf16_tn_grouped.yaml", "train_bf16_nt_grouped-k.yaml",
                                            "train_bf16_tt_grouped.yaml"]
    (written,) = [f for f in files if f.group == "bf16 nt grouped-k"]
    assert yaml.safe_load(written.text)["problems"] == [
        {"experts": 4, "n": 64, "k": 40, "rows": 32, "routing": "uniform", "grouping": "grouped-k"},
        {"experts": 4, "n": 80, "k": 64, "rows": 32, "routing": "uniform", "grouping": "grouped-k"}]
    written.path.write_text(written.text)
    loaded = load_space(written.path)
    assert loaded.problems == written.problems and all(p.grouping.value == "grouped-k" for p in loaded.problems)
    assert loaded.valid and {c.grouping.value for c in loaded.valid} == {"grouped-k"}
    r = run("space", written.path.name, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(f"{written.path.name}: 2 problems, "), r.stdout + r.stderr
    assert f"{len(loaded.valid)} valid" in r.stdout.splitlines()[0]
    # sweep plans the file (its valid configs) and stops at the GPU, the first thing it needs
    import cutlass_tune.cli._sweep

    monkeypatch.setattr(cutlass_tune.cli._sweep, "surely_no_gpu", lambda: True)
    r = run("sweep", written.path.name, cwd=tmp_path)
    assert r.returncode == 2 and "no valid config" not in r.stderr and "no CUDA" in r.stderr, r.stderr


MOE = """
import torch
from torch import nn


class Experts(nn.Module):
    def __init__(self, experts=4, hidden=64, inter=40, top_k=2):
        super().__init__()
        self.top_k, self.experts = top_k, experts
        self.router = nn.Linear(hidden, experts, bias=False)
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * inter, hidden) / 8)
        self.down = nn.Parameter(torch.randn(experts, hidden, inter) / 8)

    def forward(self, x):
        x = x.reshape(-1, x.shape[-1])
        ids, perm = torch.sort(self.router(x).topk(self.top_k, dim=-1).indices.reshape(-1))
        offs = torch.cumsum(torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1), 0,
                            dtype=torch.int32)
        gate, up = torch._grouped_mm(x[perm // self.top_k], self.gate_up.transpose(-2, -1), offs).chunk(2, -1)
        return torch._grouped_mm(torch.nn.functional.silu(gate) * up, self.down.transpose(-2, -1), offs)


def build():
    return Experts().to(torch.bfloat16), (torch.randn(2, 8, 64, dtype=torch.bfloat16),)
"""
"""MoE experts on torch._grouped_mm, nn.Linear-style stacks; 16 tokens, top 2: 32 routed rows."""


def test_shapes_backward_writes_the_weight_gradients_of_moe_experts(tmp_path):
    model_file(tmp_path, MOE, "moe.py")
    r = run("shapes", "moe.py:build", "--backward", "-o", "train.yaml", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    lines = r.stdout.splitlines()
    grouped = [line.split() for line in lines if "aten._grouped_mm" in line]
    # forward 2, weight gradients 2, input gradient 1 (down's: the inputs ask for no gradient), none skipped
    assert len(grouped) == 5 and all(g[0].endswith("_e4-uniform") for g in grouped)
    assert ["32x64x40_bf16bf16bf16_nt_grouped-k_e4-uniform", "1", "aten._grouped_mm", "(backward)"] in grouped
    (wrote,) = [line for line in lines if line.startswith("wrote train_bf16_nt_grouped-k.yaml")]
    assert wrote.startswith("wrote train_bf16_nt_grouped-k.yaml: 2 bf16 nt grouped-k problems, ")
    assert wrote.endswith("tune them with `cutlass-tune sweep train_bf16_nt_grouped-k.yaml`")
    assert int(wrote.split(", ")[1].split()[0]) > 0  # valid configs


MOE_TOKENS = MOE.replace("def build():\n    return Experts().to(torch.bfloat16), "
                         "(torch.randn(2, 8, 64, dtype=torch.bfloat16),)",
                         "def build(tokens=16):\n    return Experts().to(torch.bfloat16), "
                         "(torch.randn(tokens, 64, dtype=torch.bfloat16),)")


def test_shapes_records_the_model_at_each_token_count_in_one_file(tmp_path):
    """--tokens 1 --tokens 16: a decode run and a prefill run, their grouped problems side by side
    (2 and 32 routed rows at top 2), each called FUNCTION(tokens=N)."""
    assert MOE_TOKENS != MOE
    model_file(tmp_path, MOE_TOKENS, "moe.py")
    r = run("shapes", "moe.py:build", "--tokens", "1", "--tokens", "16", "-o", "serve.yaml", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    space = yaml.safe_load((tmp_path / "serve_bf16_tn_grouped.yaml").read_text())
    assert [(p["rows"], p["n"], p["k"]) for p in space["problems"]] == [(2, 80, 64), (2, 64, 40), (32, 80, 64),
                                                                         (32, 64, 40)]
    assert "moe.py:build at 1, 16 tokens" in space["description"]
    # a FUNCTION that takes no token count: one line naming it, nothing written
    model_file(tmp_path, MOE, "fixed.py")
    r = run("shapes", "fixed.py:build", "--tokens", "1", "-o", "fixed.yaml", cwd=tmp_path)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "tokens" in r.stderr, r.stderr
    assert not list(tmp_path.glob("fixed*.yaml"))


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "training"])
def test_moe_experts_of_a_transformers_model(backward):
    transformers = pytest.importorskip("transformers", minversion="5", reason="needs transformers >= 5")
    config = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    captured = capture_gemms(target(model, torch.zeros(2, 8, dtype=torch.long)), backward=backward)
    grouped = {p: s for p, s in captured.problems().items() if p.grouped}
    # gate_up (2 x 48 wide) and down, in each of 2 layers; training adds their input gradients (tt)
    # and weight gradients (grouped-k, E x N x K as the stacks are)
    forward = {("grouped", 96, 64, "tn"): 2, ("grouped", 64, 48, "tn"): 2}
    glu = {("grouped", 96, 64, "tn", "silu+glu"): 2}  # the gate_up GEMM's GLU twin, inference only
    training = {("grouped", 64, 96, "tt"): 2, ("grouped", 48, 64, "tt"): 2,
                ("grouped-k", 96, 64, "nt"): 2, ("grouped-k", 64, 48, "nt"): 2}
    assert {(p.grouping.value, p.n, p.k, p.layout): sum(s.values()) for p, s in grouped.items()
            if p.epilogue.is_plain} == ({**forward, **training} if backward else forward)
    assert {(p.grouping.value, p.n, p.k, p.layout, p.epilogue.name): sum(s.values()) for p, s in grouped.items()
            if not p.epilogue.is_plain} == ({} if backward else glu)
    assert {(p.groups, p.m) for p in grouped} == {(8, 32)}  # 16 tokens, top 2
    assert not [c for c, _ in captured.skipped() if c.op == "_grouped_mm"]


@pytest.mark.gpu
def test_moe_routing_histogram_on_the_gpu(tmp_path):
    model = _Experts().to(torch.bfloat16)
    captured = capture_gemms(target(model, torch.randn(2, 8, 64, dtype=torch.bfloat16)), device="cuda")
    (files,) = [f for f in space_files(captured, tmp_path / "moe.yaml", "moe") if "grouped" in f.group]
    problems = yaml.safe_load(files.text)["problems"]
    for p in problems:
        counts = p["routing"]["histogram"]
        assert len(counts) == 8 and sum(counts) == p["rows"] == 32


@pytest.mark.gpu
def test_moe_weight_gradients_routing_histogram_on_the_gpu(tmp_path):
    """Guards the weight gradients' routing read on a GPU: the forward's counts, as for the forward."""
    model = _Experts().to(torch.bfloat16)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    captured = capture_gemms(target(model, x), backward=True, device="cuda")
    files = {f.group: f for f in space_files(captured, tmp_path / "moe.yaml", "moe", backward=True)}
    forward = yaml.safe_load(files["bf16 tn grouped"].text)["problems"]
    weights = yaml.safe_load(files["bf16 nt grouped-k"].text)["problems"]
    assert len(weights) == 2 and all(p["grouping"] == "grouped-k" and p["rows"] == 32 for p in weights)
    assert {tuple(p["routing"]["histogram"]) for p in weights} == {tuple(p["routing"]["histogram"]) for p in forward}
