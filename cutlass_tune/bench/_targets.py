"""What the worker times besides a compiled kernel: the baselines, each a `Target`.

A plain problem's baseline is cuBLAS as torch calls it (`CublasTarget`). A problem with a fused
epilogue or fp8 scales has two or three (`measurement.Baseline`), each a `TorchTarget`: EAGER,
the code a PyTorch user writes for the same math, COMPILE, `torch.compile` of that same function,
and CUBLASLT, cuBLASLt's own epilogue where it computes the same function (`lt_function`).

EAGER, by problem:

- 16-bit inputs: `F.linear(a, w, bias)` (cuBLASLt's bias epilogue), then the activation
  (`F.relu`, `F.gelu`, `F.silu`), each its own pass. A residual is added before the
  activation, as the `Epilogue` defines it: `F.linear(a, w, bias) + c`, or without a bias
  `torch.addmm(c, a, w.t())` (one cuBLAS call with beta = 1, torch's best path for it).
- A gated problem (`Epilogue.gated`, C the gate's pre-activation): `activation(c) *
  F.linear(a, w, bias)`, the up projection of a gated MLP times the activated gate, as
  LLaMA's MLP writes it (`act_fn(gate_proj(x)) * up_proj(x)`); fp8 the same over `_scaled_mm`.
- fp8 inputs: `torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=...)` (unit
  scales where the problem has none), `+ c`, then the activation. A torch whose `_scaled_mm`
  refuses the bias with the problem's scales gets it added afterwards (`TorchTarget.setup`).

COMPILE is `torch.compile(fn, fullgraph=True, dynamic=False)` in the default mode, compiled once
per problem in the worker and run once (warm) before it is verified and timed. Default rather
than "max-autotune-no-cudagraphs": it is what `torch.compile(model)` gives a user, and
max-autotune benchmarks dozens of Triton GEMM templates per shape (minutes of compiling per
problem, past a tuning run's budget). Inductor keeps the GEMM in cuBLAS (`mm`/`addmm`, or
`_scaled_mm`) and fuses the bias, residual and activation into one Triton pointwise kernel, so
COMPILE is eager with the element-wise passes fused into one. "reduce-overhead" (CUDA graphs)
is left out: the graph and sustained timing methods take the host out of every side anyway.

CUBLASLT is `torch._addmm_activation(bias, a, w.t(), use_gelu=...)` for a bias with ReLU or tanh
GELU on 16-bit inputs (`Baseline.applies`), the call Inductor rewrites relu(addmm) and
tanh-gelu(addmm) into. On CUDA it runs `gemm_and_bias` (cuBLASLt with CUBLASLT_EPILOGUE_RELU_BIAS
or GELU_BIAS, for fp16, bf16 and fp32) when beta is 1, the bias is 1-D and contiguous, the result
2-D and contiguous and every dimension above 1; otherwise cuBLAS then `relu_` or `gelu_(tanh)`.
Either way its GELU is the tanh form on CUDA (torch's decomposition says so too), though the CPU
kernel computes the erf form: off CUDA it is not this baseline.

A grouped problem's baseline is GROUPED_MM, torch's grouped GEMM on the same operands
(`GroupedMmTarget`: `F.grouped_mm` where torch has it, else `torch._grouped_mm`, which it calls;
A M x K, the weights as the E x K x N view, the int32 offsets), timed with two sides in its loop:
EXPERT_LOOP (`ExpertLoopTarget`), torch.matmul of each expert's rows into its rows of D, and
DENSE (`DenseTarget`), one torch.matmul of all M rows by one expert's weight, the same FLOPs.
A block-wise fp8 grouped problem has no grouped GEMM in torch on SM90 (torch._scaled_grouped_mm
takes row-wise scales there), so each is the torch path a MoE layer of that recipe runs today
(`grouped_blockwise_paths`): GROUPED_MM dequantizes A and the weights to bf16 (fp32 products
rounded once) and calls torch's grouped GEMM; EXPERT_LOOP calls `torch._scaled_mm` block-wise per
expert (the dequantized product for an expert whose rows cuBLAS refuses); DENSE one
`torch._scaled_mm` block-wise of all M rows. The faster of the first two is the one to beat
(`measurement.contenders`).

Each target writes D only when verified (`once` outside a CUDA graph capture); what is timed
(`launch`, or `once` captured in a graph) returns a new tensor from torch's caching allocator, as
the user's code does, and copies nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .._torch import (
    SCALED_MM_K_BLOCKS,
    TORCH_DTYPE,
    apply_nodes,
    blockwise_dequantized_mm,
    blockwise_mm,
    blockwise_scaled_mm,
    blockwise_scaled_mm_for,
    dequantize_blockwise,
)
from ..measurement import Baseline
from ..space import (
    BLOCKWISE_K,
    GLU_BLOCK,
    Activation,
    DType,
    Grouping,
    Inputs,
    KindRegistry,
    Layout,
    Node,
    NodeKind,
    Pair,
    Problem,
    RuntimeArgs,
    Scaling,
)
from ._verify import Operands, Verdict, compare, epilogue_tail, group_bounds, verify_launch


class Target:
    """What `GpuRunner` measures: `setup` per variant, then `launch` (timed) after `rearm`."""

    rearm: Callable[[], object] | None = None

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        """Prepare `variant` on `ops`; why the target cannot run them, or None."""
        raise NotImplementedError

    def launch(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def sibling(self) -> Target:
        """A new target of the same kernel, to set up on other operands."""
        raise NotImplementedError

    def once(self) -> None:
        """One launch that is safe to repeat (re-arms the workspace first) and writes D."""
        if self.rearm is not None:
            self.rearm()
        self.launch()

    def check(self, ops: Operands, ref: torch.Tensor) -> Verdict:
        """Whether `once` computes the problem: D poisoned, one launch, compared with `ref`."""
        return verify_launch(self.once, ops, ref)


def blockwise_path(device: torch.device, k: int) -> str:
    """Which torch path computes a block-wise fp8 problem of inner size `k`'s baseline on
    `device` (its row's note)."""
    if blockwise_scaled_mm_for(device, k):
        return "torch._scaled_mm block-wise"
    if blockwise_scaled_mm(device):
        return (f"dequantize to bf16 + torch.matmul (this torch's block-wise _scaled_mm is wrong where K/128 is "
                f"not a multiple of {SCALED_MM_K_BLOCKS})")
    return "dequantize to bf16 + torch.matmul (this torch's _scaled_mm has no block-wise path)"


def grouped_blockwise_paths(device: torch.device, k: int) -> str:
    """Which torch paths a block-wise fp8 grouped problem of inner size `k`'s baseline row times
    (its note)."""
    loop = "torch._scaled_mm block-wise" if blockwise_scaled_mm_for(device, k) else "dequantize to bf16 + torch.matmul"
    return (f"{Baseline.GROUPED_MM.value} is dequantize A and the weights to bf16 + torch's grouped GEMM (torch "
            f"has no block-wise grouped GEMM on SM90); the expert loop is {loop} per expert")


def _fp8_baseline_gap(problem: Problem) -> str | None:
    """Why torch._scaled_mm cannot be an fp8 problem's baseline, or None."""
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no torch._scaled_mm for an fp8 baseline"
    if problem.dtype_a is DType.E5M2 and problem.dtype_b is DType.E5M2:
        return "torch._scaled_mm has no e5m2 x e5m2 GEMM"
    if problem.n % 16:
        return f"torch._scaled_mm needs N a multiple of 16, not {problem.n}"
    return None


class CublasTarget(Target):
    """torch.matmul into a preallocated D: cuBLAS with the problem's layouts, no copies.

    fp8 inputs go to torch._scaled_mm (cuBLASLt) with unit scales; it takes only the tn layout,
    which is the only fp8 layout a `Problem` allows. `fast_accum` picks its fast accumulation
    (`use_fast_accum`), the counterpart of CUTLASS's FP8FastAccum kernels; the default is its
    promoting accumulation.
    """

    def __init__(self, problem: Problem, fast_accum: bool = False):
        self._problem = problem
        self._fast_accum = fast_accum
        self._ops: Operands | None = None
        self._unit_scale: torch.Tensor | None = None  # set for fp8: _scaled_mm's scale_a/b

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        """Bind to `ops`; returns why cuBLAS cannot run the problem, or None."""
        p = self._problem
        if p.dtype_a.is_fp8 or p.dtype_b.is_fp8:
            why = _fp8_baseline_gap(p)
            if why:
                return why
            self._unit_scale = torch.ones((), dtype=torch.float32, device=ops.d.device)
        elif p.dtype_d not in (p.dtype_a, DType.F32):
            return f"torch.matmul has no {p.dtype_a.value} x {p.dtype_b.value} -> {p.dtype_d.value} GEMM"
        self._ops = ops
        return None

    def launch(self) -> None:
        ops = self._ops
        assert ops is not None, "launched before setup"
        if self._unit_scale is not None:
            torch._scaled_mm(ops.a_mk, ops.b_kn, scale_a=self._unit_scale, scale_b=self._unit_scale,
                             out_dtype=ops.d.dtype, use_fast_accum=self._fast_accum, out=ops.d)
        elif ops.d.dtype == ops.a.dtype:
            torch.matmul(ops.a_mk, ops.b_kn, out=ops.d)
        else:
            torch.mm(ops.a_mk, ops.b_kn, out_dtype=ops.d.dtype, out=ops.d)

    def close(self) -> None:
        self._ops = self._unit_scale = None

    def sibling(self) -> CublasTarget:
        return CublasTarget(self._problem, self._fast_accum)


TorchFunction = Callable[..., torch.Tensor]
"""f(a, b, bias, c, scale_a, scale_b) -> D: `a` M x K, `b` K x N (views of the stored operands;
for 16-bit inputs `b.t()` is the nn.Linear weight), the others as `Operands` holds them (None
where the problem has none; unit scales for unscaled fp8)."""


def eager_function(problem: Problem, *, fast_accum: bool = False, bias_after: bool = False) -> TorchFunction:
    """The problem's op as a PyTorch user writes it (see the module's docstring).

    `bias_after`: add an fp8 problem's bias after `torch._scaled_mm` instead of passing it in.
    """
    epilogue = problem.epilogue
    out_dtype = TORCH_DTYPE[problem.dtype_d]
    # The epilogue's nodes after the (biased) product, as torch computes them (`NODE_TORCH`): the
    # gate's activation times it, or the residual added and then the activation.
    after = [node for node in epilogue.tree().walk()
             if node.kind not in (NodeKind.ACCUMULATOR, NodeKind.SCALE, NodeKind.BIAS)]
    after_residual = [node for node in after if node.kind is not NodeKind.RESIDUAL]

    def finish(y, c):
        return apply_nodes(after, y, {"c": c})

    return EAGER_FUNCTIONS[problem.kind](EagerParts(problem, finish, after_residual, out_dtype, fast_accum,
                                                    bias_after))


@dataclasses.dataclass(frozen=True)
class EagerParts:
    """What a kind's eager function is made of (`EAGER_FUNCTIONS`): the problem, the epilogue
    after the (biased) product (`finish(y, c)`), its nodes after a residual (`after_residual`: what
    follows cuBLAS's beta = 1), D's torch type and `eager_function`'s options."""

    problem: Problem
    finish: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
    after_residual: list[Node]
    out_dtype: torch.dtype
    fast_accum: bool
    bias_after: bool


EAGER_FUNCTIONS: KindRegistry[Callable[[EagerParts], TorchFunction]] = KindRegistry("eager baseline")
"""The PyTorch code of each kind's EAGER baseline (see the module's docstring), by what the
mainloop multiplies: `F.linear` (16-bit), `torch._scaled_mm` (fp8), `blockwise_mm` (block-wise fp8)."""


@EAGER_FUNCTIONS.register()
def _eager_linear(parts: EagerParts) -> TorchFunction:
    finish, after_residual, epilogue = parts.finish, parts.after_residual, parts.problem.epilogue

    def linear(a, b, bias, c, scale_a, scale_b):
        if c is not None and bias is None and not epilogue.gated:
            return apply_nodes(after_residual, torch.addmm(c, a, b), {})  # the residual in cuBLAS's beta = 1
        return finish(F.linear(a, b.t(), bias), c)
    return linear


@EAGER_FUNCTIONS.register(inputs=Inputs.FP8)
def _eager_scaled_mm(parts: EagerParts) -> TorchFunction:
    finish, out_dtype, fast_accum, bias_after = parts.finish, parts.out_dtype, parts.fast_accum, parts.bias_after

    def fp8(a, b, bias, c, scale_a, scale_b):
        y = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, bias=None if bias_after else bias,
                             out_dtype=out_dtype, use_fast_accum=fast_accum)
        return finish(y if not bias_after or bias is None else y + bias, c)
    return fp8


@EAGER_FUNCTIONS.register(inputs=Inputs.FP8_BLOCKWISE)
def _eager_blockwise(parts: EagerParts) -> TorchFunction:
    finish, out_dtype = parts.finish, parts.out_dtype

    def blockwise(a, b, bias, c, scale_a, scale_b):
        return finish(blockwise_mm(a, b, scale_a, scale_b, out_dtype, bias), c)
    return blockwise


def lt_function(problem: Problem, *, fast_accum: bool = False, bias_after: bool = False) -> TorchFunction:
    """cuBLASLt's bias + activation epilogue as torch calls it (see the module's docstring), for a
    problem `Baseline.CUBLASLT.applies` to; the keyword arguments are `eager_function`'s and
    unused (16-bit inputs only)."""
    use_gelu = problem.epilogue.activation is Activation.GELU_TANH

    def addmm_activation(a, b, bias, c, scale_a, scale_b):
        return torch._addmm_activation(bias, a, b, use_gelu=use_gelu)
    return addmm_activation


_compiled: dict[tuple[Problem, bool, bool], TorchFunction] = {}


def compiled_function(problem: Problem, *, fast_accum: bool = False, bias_after: bool = False) -> TorchFunction:
    """`torch.compile` of `eager_function` (see the module's docstring), kept for the problem.

    Dynamo caches compiled graphs on the function's code, which every problem's function
    shares; past its recompile limit it would fall back to eager without a word. So a new
    problem resets Dynamo first, and only the last problem's functions are kept (a worker
    measures one problem at a time).
    """
    import torch._inductor.config

    # The benchmark worker is a daemon process, which may not start the children of Inductor's
    # compile pool; one or two Triton kernels per problem gain nothing from one.
    torch._inductor.config.compile_threads = 1
    key = (problem, fast_accum, bias_after)
    if key not in _compiled:
        if any(k[0] != problem for k in _compiled):
            _compiled.clear()
            torch._dynamo.reset()
        _compiled[key] = torch.compile(eager_function(problem, fast_accum=fast_accum, bias_after=bias_after),
                                       fullgraph=True, dynamic=False)
    return _compiled[key]


class _TorchCall(Target):
    """A baseline that is one torch call returning a new tensor (`_call`, bound by `setup` to
    `_ops`): launched as it is, copied into D only to be verified."""

    _call: Callable[[], torch.Tensor] | None = None
    _ops: Operands | None = None

    def launch(self) -> None:
        assert self._call is not None, "launched before setup"
        self._call()

    def once(self) -> None:
        """The call, its result copied into D for verification; inside a CUDA graph capture
        (sustained timing replays graphs of `once`) the call alone, so no copy is ever timed."""
        assert self._call is not None and self._ops is not None, "launched before setup"
        out = self._call()
        if not (out.is_cuda and torch.cuda.is_current_stream_capturing()):
            self._ops.d.copy_(out)

    def close(self) -> None:
        self._call = self._ops = None


class TorchTarget(_TorchCall):
    """A fused problem's EAGER, COMPILE or CUBLASLT baseline (`kind`) on the problem's operands.

    `fast_accum` as `CublasTarget`'s. `setup` makes the first call (for COMPILE, the compile)
    and returns why torch cannot run the problem, or None.
    """

    def __init__(self, problem: Problem, kind: Baseline, fast_accum: bool = False):
        assert kind is not Baseline.CUBLAS, "a plain problem's baseline is a CublasTarget"
        self._problem, self._kind, self._fast_accum = problem, kind, fast_accum
        self._call: Callable[[], torch.Tensor] | None = None
        self._ops: Operands | None = None
        self._bias_after = False

    @property
    def kind(self) -> Baseline:
        return self._kind

    def _function(self) -> TorchFunction:
        make = {Baseline.EAGER: eager_function, Baseline.COMPILE: compiled_function,
                Baseline.CUBLASLT: lt_function}[self._kind]
        return make(self._problem, fast_accum=self._fast_accum, bias_after=self._bias_after)

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        p = self._problem
        if not self._kind.applies(p):
            return f"{self._kind.value} does not compute {p.epilogue.name} on {p.dtype_a.value} -> {p.dtype_d.value}"
        if self._kind is Baseline.CUBLASLT and p.epilogue.activation is Activation.GELU_TANH and not ops.d.is_cuda:
            return f"{self._kind.value}: torch._addmm_activation computes the erf GELU off CUDA"
        scale_a, scale_b = ops.scale_a, ops.scale_b
        if p.dtype_a.is_fp8 or p.dtype_b.is_fp8:
            why = _fp8_baseline_gap(p)
            if why:
                return why
            if p.scaling is Scaling.NONE:
                scale_a = scale_b = torch.ones((), dtype=torch.float32, device=ops.d.device)
        elif p.dtype_d is not p.dtype_a:
            return f"F.linear has no {p.dtype_a.value} x {p.dtype_b.value} -> {p.dtype_d.value} GEMM"
        args = (ops.a_mk, ops.b_kn, ops.bias, ops.c, scale_a, scale_b)
        try:
            try:
                self._run_first(args)
            except RuntimeError:
                if not (p.dtype_a.is_fp8 and ops.bias is not None):
                    raise
                self._bias_after = True  # this torch's _scaled_mm takes no bias with these scales
                self._run_first(args)
        except Exception as err:  # noqa: BLE001 - torch.compile raises many kinds; each is a reason
            text = str(err).strip().splitlines()
            return f"{self._kind.value}: {type(err).__name__}: {text[0] if text else ''}"[:500]
        self._ops = ops
        return None

    def _run_first(self, args: tuple) -> None:
        fn = self._function()
        fn(*args)
        self._call = lambda: fn(*args)

    def sibling(self) -> TorchTarget:
        twin = TorchTarget(self._problem, self._kind, self._fast_accum)
        twin._bias_after = self._bias_after
        return twin


def grouped_mm() -> Callable[..., torch.Tensor] | None:
    """torch's grouped GEMM, `F.grouped_mm` or (older torch) `torch._grouped_mm`; None without one."""
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


class GroupedMmTarget(_TorchCall):
    """A grouped problem's GROUPED_MM baseline: torch's grouped GEMM as a MoE layer calls it,
    `grouped_mm(a, w.transpose(-2, -1), offs=offsets)`, into a new tensor. `setup` makes the
    first call and returns why torch cannot run it (no grouped GEMM in this torch, or the one
    it has refuses these operands), or None."""

    def __init__(self, problem: Problem):
        self._problem = problem
        self._call: Callable[[], torch.Tensor] | None = None
        self._ops: Operands | None = None

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        fn = grouped_mm()
        if fn is None:
            return f"torch {torch.__version__} has no grouped GEMM (torch._grouped_mm)"
        call = _grouped_call(fn, ops)
        try:
            call()
        except (RuntimeError, NotImplementedError, ValueError) as err:
            text = str(err).strip().splitlines()
            return f"{Baseline.GROUPED_MM.value}: {type(err).__name__}: {text[0] if text else ''}"[:500]
        self._call = call
        self._ops = ops
        return None

    def sibling(self) -> GroupedMmTarget:
        return GroupedMmTarget(self._problem)


def _grouped_call(fn: Callable[..., torch.Tensor], ops: Operands) -> Callable[[], torch.Tensor]:
    """torch's grouped GEMM `fn` on the operands, as a MoE layer of the problem's kind calls it
    (`GROUPED_MM_CALLS`)."""
    return GROUPED_MM_CALLS[ops.problem.kind](fn, ops)


GROUPED_MM_CALLS: KindRegistry[Callable[[Callable[..., torch.Tensor], Operands], Callable[[], torch.Tensor]]] = \
    KindRegistry("grouped GEMM call")
"""How each grouped kind calls torch's grouped GEMM (GROUPED_MM), by what the mainloop multiplies."""


@GROUPED_MM_CALLS.register(grouping=Grouping.GROUPED)
def _grouped_mm_call(fn: Callable[..., torch.Tensor], ops: Operands) -> Callable[[], torch.Tensor]:
    ops = torch_operands(ops)
    a, b, offsets = ops.a_mk, ops.b_kn, ops.offsets
    after = epilogue_after_gemm(ops.problem)
    if after is not None:  # a fused grouped problem: torch's epilogue after its GEMM
        return lambda: after(fn(a, b, offs=offsets))
    return lambda: fn(a, b, offs=offsets)


def epilogue_after_gemm(problem: Problem) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What a grouped problem's epilogue does after the GEMM, as torch computes it on the M x N
    product of `torch_operands` (an activation; a GLU pair's act(gate) * up, M x N/2, of the
    split halves); None where it does nothing."""
    nodes = [dataclasses.replace(node, pair=Pair.SPLIT) if node.pair is Pair.INTERLEAVED else node
             for node in epilogue_tail(problem)]
    if not nodes:
        return None
    return lambda value: apply_nodes(nodes, value, {})


def torch_operands(ops: Operands) -> Operands:
    """The operands torch's sides of a problem compute on: the problem's own, but for a GLU pair
    the kernel reads interleaved (`Pair.INTERLEAVED`), whose weights torch's sides take in the
    order a model keeps them, gate rows then up rows (`Pair.SPLIT`, transformers' gate_up_proj):
    their act(gate) * up then reads the product's halves as views, as a model's torch code does,
    where the interleaved order would time two copies of the product as well. Same math, the
    same result; the copy is made once, at setup."""
    if not any(node.pair is Pair.INTERLEAVED for node in epilogue_tail(ops.problem)):
        return ops
    n = ops.problem.n
    order = torch.arange(n, device=ops.b.device).reshape(n // (2 * GLU_BLOCK), 2, GLU_BLOCK).transpose(0, 1)
    dim = ops.b.dim() - (2 if ops.problem.layout_b is Layout.COL else 1)  # the weights' N
    return dataclasses.replace(ops, b=ops.b.index_select(dim, order.reshape(n)))


@GROUPED_MM_CALLS.register(grouping=Grouping.GROUPED, inputs=Inputs.FP8_BLOCKWISE)
def _grouped_blockwise_mm_call(fn: Callable[..., torch.Tensor], ops: Operands) -> Callable[[], torch.Tensor]:
    """Block-wise fp8 operands dequantized to bf16 first, in the same call (a layer keeps its fp8
    weights and scales)."""
    a, offsets = ops.a_mk, ops.offsets
    scale_a, scale_b, weights = ops.scale_a, ops.scale_b, ops.b_kn.transpose(-2, -1)  # weights E x N x K
    assert scale_a is not None and scale_b is not None
    return lambda: fn(dequantize_blockwise(a, scale_a, 1),
                      dequantize_blockwise(weights, scale_b, BLOCKWISE_K).transpose(-2, -1), offs=offsets)


@GROUPED_MM_CALLS.register(grouping=Grouping.GROUPED_K)
def _weight_gradient_mm_call(fn: Callable[..., torch.Tensor], ops: Operands) -> Callable[[], torch.Tensor]:
    """The weight gradient as torch's backward of a grouped GEMM computes it: G^T (N x M, a view)
    times X over K-ragged groups, `grouped_mm(g.t(), x, offs=offsets)`, E x N x K."""
    g_t, x, offsets = ops.a.t(), ops.b, ops.offsets
    return lambda: fn(g_t, x, offs=offsets)


@dataclasses.dataclass(frozen=True)
class ExpertGemm:
    """One GEMM of routed rows by one expert's weight as torch runs it for a grouped kind
    (`EXPERT_GEMMS`): `bind(ops, expert, rows, out)` gives the call writing `out`; `tried`: the
    baseline runs its calls once in `setup`, since torch may refuse the operands."""

    bind: Callable[[Operands, int, slice, torch.Tensor], Callable[[], object]]
    tried: bool = False


def _expert_matmul(ops: Operands, expert: int, rows: slice, out: torch.Tensor) -> Callable[[], object]:
    return functools.partial(torch.matmul, ops.a_mk[rows], ops.b_kn[expert], out=out)


def _expert_blockwise(ops: Operands, expert: int, rows: slice, out: torch.Tensor) -> Callable[[], object]:
    assert ops.scale_a is not None and ops.scale_b is not None
    return _blockwise_call(ops.a_mk[rows], ops.b_kn[expert], ops.scale_a[rows], ops.scale_b[expert], out)


EXPERT_GEMMS: KindRegistry[ExpertGemm] = KindRegistry("expert GEMM")
"""The per-expert GEMM of each grouped kind's EXPERT_LOOP and DENSE baselines."""
EXPERT_GEMMS.add(ExpertGemm(_expert_matmul), grouping=Grouping.GROUPED)
EXPERT_GEMMS.add(ExpertGemm(_expert_blockwise, tried=True), grouping=Grouping.GROUPED, inputs=Inputs.FP8_BLOCKWISE)


class ExpertLoopTarget(Target):
    """EXPERT_LOOP: `torch.matmul(a[rows of e], w_e.t(), out=d[rows of e])` for each expert e
    with rows, the loop a MoE layer writes without a grouped GEMM. The row counts come from the
    problem, not from the offsets on the device: the loop pays no device-to-host copy, which a
    real one does (`offsets.tolist()`), so it reads a little fast."""

    def __init__(self, problem: Problem):
        self._problem = problem
        self._calls: list[Callable[[], object]] = []

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        gemm = EXPERT_GEMMS[self._problem.kind]
        bounds = [(e, lo, hi) for e, (lo, hi) in enumerate(group_bounds(self._problem)) if hi > lo]
        ops = torch_operands(ops)
        after, d = epilogue_after_gemm(self._problem), ops.d
        # the product is M x N where D is narrower (a GLU pair's M x N/2): a tensor of its own
        product = d if d.shape[1] == self._problem.n else d.new_empty((self._problem.m, self._problem.n))
        self._calls = [gemm.bind(ops, e, slice(lo, hi), product[lo:hi]) for e, lo, hi in bounds]
        if after is not None:  # a fused grouped problem: torch's epilogue after its GEMMs
            self._calls.append(lambda: d.copy_(after(product)))
        return _first_call_fails(self._calls, Baseline.EXPERT_LOOP) if gemm.tried else None

    def launch(self) -> None:
        for call in self._calls:
            call()

    def close(self) -> None:
        self._calls = []

    def sibling(self) -> ExpertLoopTarget:
        return ExpertLoopTarget(self._problem)


class DenseTarget(Target):
    """DENSE: `torch.matmul(a, w_e.t())` of all M rows by the weight of the expert with the most
    rows, into an M x N tensor of its own: a dense GEMM of the grouped problem's FLOPs, the
    ceiling its kernels approach. It does not compute the grouped problem, so `check` compares
    the rows of that expert only, which it does compute."""

    def __init__(self, problem: Problem):
        self._problem = problem
        self._expert = max(range(problem.groups), key=lambda e: problem.group_rows[e]) if problem.groups else 0
        self._call: Callable[[], object] | None = None
        self._out: torch.Tensor | None = None

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        gemm = EXPERT_GEMMS[self._problem.kind]
        self._out = out = torch.empty_like(ops.d)
        ops = torch_operands(ops)
        after = epilogue_after_gemm(self._problem)
        product = out if out.shape[1] == self._problem.n else out.new_empty((self._problem.m, self._problem.n))
        call = gemm.bind(ops, self._expert, slice(None), product)
        if after is not None:  # a fused grouped problem: torch's epilogue after its GEMM

            def gemm_then_epilogue() -> object:
                call()
                return out.copy_(after(product))
            self._call = gemm_then_epilogue
        else:
            self._call = call
        return _first_call_fails([self._call], Baseline.DENSE) if gemm.tried else None

    def launch(self) -> None:
        assert self._call is not None, "launched before setup"
        self._call()

    def check(self, ops: Operands, ref: torch.Tensor) -> Verdict:
        assert self._out is not None, "checked before setup"
        lo, hi = group_bounds(self._problem)[self._expert]
        self._out.fill_(float("nan"))
        self.once()
        if self._out.is_cuda:
            torch.cuda.synchronize(self._out.device)
        return compare(self._out[lo:hi], ref[lo:hi], self._problem.dtype_d, fp8_inputs=self._problem.dtype_a.is_fp8)

    def close(self) -> None:
        self._call = self._out = None

    def sibling(self) -> DenseTarget:
        return DenseTarget(self._problem)


def _blockwise_call(a: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_w: torch.Tensor,
                    out: torch.Tensor) -> Callable[[], object]:
    """One block-wise fp8 GEMM into `out` as torch runs it: `a` rows x K, `w` K x N (a view of an
    N x K weight), `scale_a` rows x K/128 row-major, `scale_w` the weight's N/128 x K/128.
    torch._scaled_mm takes A's scales outer-dim-major: they are laid out so here, once, outside
    what is timed (a model would quantize into that layout). Where torch has no block-wise
    _scaled_mm, or its cuBLAS call refuses these rows (tried once, here), the dequantized product
    (`blockwise_dequantized_mm`), copied into `out`."""
    scale_a = scale_a.t().contiguous().t()
    scaled = functools.partial(torch._scaled_mm, a, w, scale_a, scale_w.t(), out_dtype=out.dtype, out=out)
    if blockwise_scaled_mm_for(a.device, a.shape[1]):
        try:
            scaled()
            return scaled
        except (RuntimeError, ValueError):  # e.g. a row count cuBLAS's block-wise GEMM does not take
            pass
    return lambda: out.copy_(blockwise_dequantized_mm(a, w, scale_a, scale_w.t(), out.dtype))


def _first_call_fails(calls: list[Callable[[], object]], kind: Baseline) -> str | None:
    """Each call once: why one fails (torch refuses its operands), or None."""
    try:
        for call in calls:
            call()
    except (RuntimeError, NotImplementedError, ValueError) as err:
        text = str(err).strip().splitlines()
        return f"{kind.value}: {type(err).__name__}: {text[0] if text else ''}"[:500]
    return None


_GROUPED_TARGETS: dict[Baseline, Callable[[Problem], Target]] = {
    Baseline.GROUPED_MM: GroupedMmTarget, Baseline.EXPERT_LOOP: ExpertLoopTarget, Baseline.DENSE: DenseTarget,
}


BASELINE_NOTES: KindRegistry[Callable[[torch.device, int], str] | None] = KindRegistry("baseline note")
"""What a kind's baseline row notes of the torch paths it times (given the device and K), by
kind: which path computes a block-wise fp8 problem's baseline; nothing for the others."""
BASELINE_NOTES.add(None)
BASELINE_NOTES.add(lambda device, k: f"torch eager is {blockwise_path(device, k)}", grouping=Grouping.NONE,
                   inputs=Inputs.FP8_BLOCKWISE)
BASELINE_NOTES.add(grouped_blockwise_paths, grouping=Grouping.GROUPED, inputs=Inputs.FP8_BLOCKWISE)


def baseline_note(problem: Problem, device: torch.device) -> str | None:
    """The note of `problem`'s baseline row on the paths it times (`BASELINE_NOTES`), or None."""
    note = BASELINE_NOTES[problem.kind]
    return None if note is None else note(device, problem.k)


def baseline_target(problem: Problem, kind: Baseline, fast_accum: bool = False) -> Target:
    """The target that measures `kind` on `problem`."""
    if kind is Baseline.CUBLAS:
        return CublasTarget(problem, fast_accum)
    if kind in _GROUPED_TARGETS:
        return _GROUPED_TARGETS[kind](problem)
    return TorchTarget(problem, kind, fast_accum)
