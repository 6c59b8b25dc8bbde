"""The tuned grouped GEMM of MoE experts: `grouped_mm` runs a table's ptr-array grouped kernel
on torch tensors, with torch._grouped_mm's 2D x 3D semantics.

    a: M x K row-major, the routed rows sorted by expert (M: tokens times top-k)
    b: E x K x N, the experts' weights: `w.transpose(-2, -1)` of an E x N x K stack of
       nn.Linear-style weights ("tn"), or a contiguous E x K x N stack ("tt")
    offs: E int32 cumulative row ends on a's device (expert e has rows offs[e-1]:offs[e])
    D: M x N row-major; rows past offs[-1] are left as the kernel finds them (as torch's)

fp8 experts (DeepSeek-V3's and Qwen3-FP8's recipe): a and b float8_e4m3fn with block-wise scales,
D bfloat16. `scale_a` is M x K/128 float32 row-major, one per 1 x 128 group of a routed row, as
MoE code quantizes the routed activations (and as the grouped kernel reads them: expert e's are
rows offs[e-1]:offs[e], a pointer into the tensor, no copy); `scale_b` the experts' weight scales,
E x N/128 x K/128 contiguous, one per 128 x 128 block of each N x K weight (or its
transpose(-2, -1) view, E x K/128 x N/128, matching b's).

The kernel reads `offs` on the device (no host sync): its `run` rebuilds the per-group
arrays from them before each launch, so a CUDA graph replayed with other counts in the same
`offs` tensor computes the new routing. Those arrays live in the kernel's workspace: one kept per
thread and stream for direct calls, one from torch's caching allocator per call for the operator
(see `GroupedGemm.launch`).
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch._C._autograd import _profiler_enabled

from .._torch import ACTIVATION, BLOCKWISE_GROUP, TORCH_DTYPE, dequantize_blockwise, glu_halves
from ..kernel import GemmArgs, KernelStatusError, bind_primary_context, make_args
from ..space import Activation, DType, Epilogue, Grouping, Layout, Pair, Problem, Scaling, check_problem
from ..tables import PROFILER_RANGE
from . import _native
from ._dispatch import (
    KERNEL_CLASSES,
    OUT_DTYPES,
    Call,
    Kind,
    Plan,
    Ready,
    Workspace,
    cannot_implement,
    current_stream,
    load_table,
    prepare,
    sm_count,
)
from ._matmul import _MIN_RATIO, _NO_ACTIVATION, _TENSOR, Gemm, MatmulInputError, activation_of, k_not_whole
from ._table import BestTable

_DTYPES = {TORCH_DTYPE[d]: d for d in (DType.BF16, DType.F16)}
_FP8 = TORCH_DTYPE[DType.E4M3]
ALIGNMENT = 8
"""N and K of a grouped call are multiples of this (16 bytes of a 16-bit type: TMA's rows)."""


def _b_layout(b: torch.Tensor) -> Layout:
    """COL for an E x K x N view of an E x N x K contiguous stack ("tn"), ROW for a contiguous
    E x K x N one ("tt")."""
    e, k, n = b.shape
    if b.stride() == (k * n, 1, k) or (n == 1 and b.stride()[:2] == (k, 1)):
        return Layout.COL
    if b.stride() == (k * n, n, 1) or (k == 1 and b.stride()[::2] == (n, 1)):
        return Layout.ROW
    raise MatmulInputError(f"b {tuple(b.shape)} with strides {b.stride()} is neither an E x K x N contiguous stack "
                           "nor the transpose(-2, -1) of a contiguous E x N x K one")


def grouped_scales(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor | None,
                   scale_b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A `grouped_mm` call's block-wise scales, checked against a (M x K) and b (E x K x N): None
    for 16-bit inputs without scales, else `scale_a` (M x K/128 row-major) and `scale_b` as the
    kernel reads it, E x N/128 x K/128 contiguous (given so, or as its transpose(-2, -1) view).
    Raises MatmulInputError with what to fix."""
    fp8 = a.dtype == _FP8
    if scale_a is None and scale_b is None and not fp8:
        return None
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise MatmulInputError(f"{name} must be a torch.Tensor or None, not {type(t).__name__}")
    if not fp8:
        raise MatmulInputError(f"scale_a and scale_b scale float8_e4m3fn inputs; a and b are {a.dtype}")
    if scale_a is None or scale_b is None:
        raise MatmulInputError("fp8 grouped_mm needs block-wise scale_a (M x K/128) and scale_b (E x N/128 x K/128)")
    (m, k), (e, _, n) = a.shape, b.shape
    k_blocks, n_blocks = -(-k // BLOCKWISE_GROUP), -(-n // BLOCKWISE_GROUP)
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.dtype != torch.float32:
            raise MatmulInputError(f"{name} has dtype {t.dtype}; block-wise scales are torch.float32")
        if t.device != a.device:
            raise MatmulInputError(f"{name} is on {t.device} and a on {a.device}")
    whole = k_not_whole(k)
    if tuple(scale_a.shape) != (m, k_blocks):
        raise MatmulInputError(f"scale_a has shape {tuple(scale_a.shape)}; block-wise it must be ({m}, {k_blocks}): "
                               f"one per 1 x {BLOCKWISE_GROUP} group of each row of a{whole}")
    if scale_a.stride() != (k_blocks, 1) and m > 1 and k_blocks > 1:
        raise MatmulInputError(f"scale_a with strides {scale_a.stride()} must be row-major (each row's groups "
                               "together, as MoE code quantizes them): call .contiguous() first")
    weight_major = (e, n_blocks, k_blocks)
    if tuple(scale_b.shape) == weight_major and scale_b.is_contiguous():
        return scale_a, scale_b
    view = scale_b.transpose(-2, -1)
    if tuple(view.shape) == weight_major and view.is_contiguous():
        return scale_a, view
    raise MatmulInputError(f"scale_b has shape {tuple(scale_b.shape)} and strides {scale_b.stride()}; block-wise it "
                           f"must be the experts' weight scales, {weight_major} contiguous (one per {BLOCKWISE_GROUP} "
                           f"x {BLOCKWISE_GROUP} block of each N x K weight), or their transpose(-2, -1){whole}")


def grouped_problem_of(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                       out_dtype: torch.dtype | None = None, scale_a: torch.Tensor | None = None,
                       scale_b: torch.Tensor | None = None, activation: Activation = Activation.NONE,
                       pair: Pair = Pair.NONE) -> Problem:
    """The grouped `Problem` the tensors of a `grouped_mm` call pose (its routing uniform: the
    real counts are on the device); fp8 inputs with block-wise scales (`grouped_scales`) pose the
    block-wise operation; `pair` a GLU pair of b's N columns (D of N/2: the MoE layer's gate_up
    with its activation in the epilogue). Raises MatmulInputError with what to fix."""
    for name, t in (("a", a), ("b", b), ("offs", offs)):
        if not isinstance(t, torch.Tensor):
            raise MatmulInputError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
        if t.device.type != "cuda":
            raise MatmulInputError(f"{name} is on {t.device}: the tuned kernels run on a CUDA device")
    if a.dim() != 2 or b.dim() != 3:
        raise MatmulInputError(f"a must be 2-D (M x K) and b 3-D (E x K x N), not {a.dim()}-D and {b.dim()}-D")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in _DTYPES and t.dtype != _FP8:
            raise MatmulInputError(f"{name} has dtype {t.dtype}; the tuned grouped kernels take bfloat16, float16 "
                                   "or float8_e4m3fn (with block-wise scales)")
        if t.data_ptr() % 16:
            raise MatmulInputError(f"{name} starts at an address that is not 16-byte aligned (TMA needs it)")
    if a.dtype != b.dtype:
        raise MatmulInputError(f"a is {a.dtype} and b is {b.dtype}: they must match")
    if b.device != a.device or offs.device != a.device:
        raise MatmulInputError(f"a, b and offs must be on one device, not {a.device}, {b.device} and {offs.device}")
    (m, k), (e, kb, n) = a.shape, b.shape
    if k != kb:
        raise MatmulInputError(f"a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply (K {k} and {kb})")
    if offs.dtype != torch.int32 or offs.dim() != 1 or offs.shape[0] != e:
        raise MatmulInputError(f"offs must be {e} int32 values (one row end per expert), not {offs.dtype} of shape "
                               f"{tuple(offs.shape)}")
    fp8 = a.dtype == _FP8
    align = 16 if fp8 else ALIGNMENT
    if n % align or k % align:
        raise MatmulInputError(f"N {n} and K {k} must be multiples of {align} (each expert's rows are read "
                               "by TMA in 16-byte units)")
    if a.stride() != (k, 1) and m > 1:
        raise MatmulInputError(f"a {tuple(a.shape)} with strides {a.stride()} is not row-major contiguous: "
                               "call .contiguous() first")
    scales = grouped_scales(a, b, scale_a, scale_b)
    if fp8 and out_dtype not in (None, torch.bfloat16):
        raise MatmulInputError(f"out_dtype {out_dtype}: fp8 grouped_mm gives bfloat16")
    dtype = DType.E4M3 if fp8 else _DTYPES[a.dtype]
    out = DType.BF16 if fp8 else OUT_DTYPES.get(out_dtype) if out_dtype is not None else dtype
    if out is None:
        raise MatmulInputError(f"out_dtype {out_dtype} is not supported (bfloat16, float16, float32)")
    def posed(rows: int) -> Problem:
        return Problem.experts(e, n, k, rows, dtype_a=dtype, dtype_b=dtype, dtype_d=out, layout_b=_b_layout(b),
                               scaling=Scaling.NONE if scales is None else Scaling.BLOCKWISE,
                               epilogue=Epilogue(activation=activation, pair=pair))

    problem = posed(m)
    # No routed rows (an expert-parallel rank given no tokens) pose an empty result, as torch's:
    # the rules are checked for one row per expert.
    why = check_problem(problem if m else posed(e))
    if why:
        raise MatmulInputError(f"{e} experts of {n}x{k} with {m} rows: {why[0].reason}")
    return problem


def weight_grad_problem_of(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> Problem:
    """The weight-gradient `Problem` (`Grouping.GROUPED_K`) of dW_e = g_e^T x_e: `g` the output
    gradient (M x N), `x` the input (M x K), both row-major with rows sorted by expert, `offs` E
    int32 cumulative row ends (the forward's); dW is E x N x K. Its routing uniform (the real
    counts are on the device). Raises MatmulInputError with what to fix."""
    for name, t in (("g", g), ("x", x), ("offs", offs)):
        if not isinstance(t, torch.Tensor):
            raise MatmulInputError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if g.dim() != 2 or x.dim() != 2 or g.shape[0] != x.shape[0]:
        raise MatmulInputError(f"g and x must be 2-D with the same rows (M x N and M x K), not {tuple(g.shape)} and "
                               f"{tuple(x.shape)}")
    if g.dtype not in _DTYPES or x.dtype != g.dtype:
        raise MatmulInputError(f"g is {g.dtype} and x is {x.dtype}: the weight-gradient kernels take both bfloat16 "
                               "or both float16")
    (m, n), k = g.shape, x.shape[1]
    if offs.dtype != torch.int32 or offs.dim() != 1 or offs.shape[0] < 1:
        raise MatmulInputError(f"offs must be E int32 values (one row end per expert), not {offs.dtype} of shape "
                               f"{tuple(offs.shape)}")
    if n % ALIGNMENT or k % ALIGNMENT:
        raise MatmulInputError(f"N {n} and K {k} must be multiples of {ALIGNMENT} (each expert's first row is read "
                               "by TMA in 16-byte units)")
    for name, t, width in (("g", g, n), ("x", x, k)):
        if t.stride() != (width, 1) and m > 1:
            raise MatmulInputError(f"{name} {tuple(t.shape)} with strides {t.stride()} is not row-major contiguous: "
                                   "call .contiguous() first")
    for name, t in (("g", g), ("x", x), ("offs", offs)):
        if t.device.type != "cuda":
            raise MatmulInputError(f"{name} is on {t.device}: the tuned kernels run on a CUDA device")
        if t.device != g.device:
            raise MatmulInputError(f"g, x and offs must be on one device, not {g.device}, {x.device} and "
                                   f"{offs.device}")
    for name, t in (("g", g), ("x", x)):
        if t.data_ptr() % 16:
            raise MatmulInputError(f"{name} starts at an address that is not 16-byte aligned (TMA needs it)")
    dtype, e = _DTYPES[g.dtype], offs.shape[0]
    problem = Problem.experts(e, n, k, m, dtype_a=dtype, dtype_b=dtype, dtype_d=dtype, layout_a=Layout.COL,
                              layout_b=Layout.ROW, grouping=Grouping.GROUPED_K)
    why = check_problem(problem if m else Problem.experts(e, n, k, e, **problem.operation_fields()))
    if why:
        raise MatmulInputError(f"{e} experts' weight gradients of {n}x{k} over {m} rows: {why[0].reason}")
    return problem


def _torch_grouped() -> Callable[..., torch.Tensor] | None:
    """torch's grouped GEMM: `F.grouped_mm`, else (older torch) `torch._grouped_mm`; None without one."""
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def torch_weight_grad(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """dW_e = g_e^T x_e (E x N x K) as torch's backward of a grouped GEMM computes it:
    `torch._grouped_mm(g.t(), x, offs=offs)`; without it (older torch) a loop over the experts,
    which reads offs on the host. An expert of no rows gets zeros."""
    grouped = _torch_grouped()
    if grouped is not None:
        return grouped(g.t(), x, offs=offs)
    out = g.new_zeros((offs.shape[0], g.shape[1], x.shape[1]))
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[e] = (g[start:end].t().float() @ x[start:end].float()).to(g.dtype)
        start = end
    return out


def _out_shape(problem: Problem) -> tuple[int, ...]:
    """The result of a grouped launch: E x N x K for the weight gradient, else D's rows."""
    if problem.grouping is Grouping.GROUPED_K:
        return (problem.groups, problem.n, problem.k)
    return problem.epilogue.output_shape(problem.m, problem.n)


def torch_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """What `grouped_mm` runs where no tuned kernel can: torch's grouped GEMM (F.grouped_mm,
    else torch._grouped_mm, else a loop over the experts, which reads offs on the host). An
    output type other than the inputs' that torch's kernel refuses is computed in float32 and cast."""
    dtype = out_dtype or a.dtype
    grouped = _torch_grouped()
    if grouped is not None:
        if dtype == a.dtype:
            return grouped(a, b, offs=offs)
        try:
            return grouped(a, b, offs=offs, out_dtype=dtype)
        except RuntimeError:  # CPU builds take only the inputs' type
            return grouped(a.float(), b.float(), offs=offs).to(dtype)
    out = a.new_zeros((a.shape[0], b.shape[2]), dtype=dtype)
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = (a[start:end].float() @ b[e].float()).to(dtype)
        start = end
    return out


def torch_blockwise_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, scale_a: torch.Tensor,
                               scale_b: torch.Tensor) -> torch.Tensor:
    """What `grouped_mm` runs for block-wise fp8 experts where no tuned kernel can (torch has no
    block-wise grouped GEMM on SM90): a and the weights dequantized to bfloat16
    (`dequantize_blockwise`), then torch's grouped GEMM (`torch_grouped_mm`). `scale_b` is E x
    N/128 x K/128 (`grouped_scales`)."""
    weights = dequantize_blockwise(b.transpose(-2, -1), scale_b, BLOCKWISE_GROUP)
    return torch_grouped_mm(dequantize_blockwise(a, scale_a, 1), weights.transpose(-2, -1), offs, torch.bfloat16)


READY_GROUPED = 256
"""Initialized grouped instances a `GroupedGemm` keeps per thread, by shape and addresses: a
model's steady forward hands each layer's call the same buffers again (the caching allocator
repeats itself), and such a call launches with no initialization. 256: two projections of a
deep model, forward and backward, without cycling an LRU smaller than one forward."""


def _may_keep(device: int, stream: int) -> bool:
    """Whether a workspace allocated now on `stream` may be kept past the call: not on the stream
    on which torch.compile's CUDA graph trees warm up and record (`mode="reduce-overhead"`),
    where the allocator hands out their graphs' private pool, whose live memory they check.
    Asked only where no kept workspace fits yet: once per other stream, and on the trees' stream
    only while they warm up or record (their replays run no Python)."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return True  # no CUDA graph tree exists in a process that never imported them
    try:
        if not (hasattr(trees.local, "tree_manager_containers") or torch._C._is_key_in_tls("tree_manager_containers")):
            return True
        container = trees.get_obj(trees.local, "tree_manager_containers").get(device)
        manager = getattr(container, "tree_manager", None)
        return manager is None or manager.stream.cuda_stream != stream
    except (AttributeError, KeyError, RuntimeError, TypeError):
        return False  # torch's internals moved: a workspace per call is right in every case


@dataclasses.dataclass(frozen=True, eq=False)
class GroupedLaunch:
    """What every call of one grouped problem on one device shares, worked out on its first:
    the arguments with no addresses yet, the workspace's size, the result's shape and type.
    Compared and hashed by identity (a cache key of the hot path)."""

    problem: Problem
    device: int
    args: GemmArgs
    workspace_bytes: int
    out_shape: tuple[int, ...]
    out_dtype: torch.dtype


class GroupedGemm(Gemm):
    """One tuned grouped kernel, compiled (or taken from a bundle) and loaded once. Thread-safe.
    Arguments and errors as `Gemm`'s."""

    def prepare(self, problem: Problem, device: int) -> GroupedLaunch:
        """The per-problem part of a launch on CUDA device `device` (host calls only)."""
        args = make_args(problem, self.runtime, a=0, b=0, d=0, device_id=device, sm_count=sm_count(device),
                         offsets=0)
        return GroupedLaunch(problem, device, args, self.kernel.workspace_size(args), _out_shape(problem),
                             self._dtype_d)

    def template(self, problem: Problem, device: int) -> tuple[GemmArgs, int]:
        """The launch arguments of `problem` on CUDA device `device` with every address zero (a
        `Plan`'s), and the workspace the kernel needs for them in bytes."""
        launch = self.prepare(problem, device)
        return launch.args, launch.workspace_bytes

    def workspace_policy(self, size: int, keep: bool = True) -> Workspace:
        """Where a launch's workspace comes from (see `launch`)."""
        if size == 0:
            return Workspace.NONE
        return Workspace.KEPT if keep else Workspace.PER_CALL

    def launch_of(self, plan: Plan) -> GroupedLaunch:
        """The `GroupedLaunch` of `plan` (its arguments and workspace size, worked out once)."""
        return GroupedLaunch(plan.problem, plan.device, GemmArgs.from_buffer_copy(plan.args), plan.workspace_bytes,
                             _out_shape(plan.problem), self._dtype_d)

    def run_grouped(self, problem: Problem, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                    out: torch.Tensor | None = None, *, scale_a: torch.Tensor | None = None,
                    scale_b: torch.Tensor | None = None) -> torch.Tensor:
        """Launch on tensors already checked to pose `problem` (`grouped_problem_of`), with a
        workspace of this call (see `launch`). Raises KernelStatusError."""
        device = a.device.index if a.device.index is not None else torch.cuda.current_device()
        return self.launch(self.prepare(problem, device), a, b, offs, out, scale_a=scale_a, scale_b=scale_b)

    def run_weight_grad(self, g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """dW_e = g_e^T x_e of every expert (E x N x K, 0 for an expert without rows) with this
        weight-gradient kernel (`Grouping.GROUPED_K`), as `run_grouped` launches: the tensors
        checked (`weight_grad_problem_of`), a workspace of this call. `out`, if given, is a
        contiguous E x N x K tensor of g's type.

        Raises:
            MatmulInputError: the kernel is not a weight-gradient one, or the tensors do not pose
                its problem.
            KernelStatusError: CUTLASS refuses the problem.
        """
        if self.config.grouping is not Grouping.GROUPED_K:
            raise MatmulInputError(f"{self.config.name} is not a weight-gradient kernel (grouping "
                                   f"{Grouping.GROUPED_K.value})")
        problem = weight_grad_problem_of(g, x, offs)
        if problem.operation != self.config.operation:
            raise MatmulInputError(f"{self.config.name} computes {self.config.operation.name}; g and x pose "
                                   f"{problem.operation.name}")
        shape = _out_shape(problem)
        if out is not None and (tuple(out.shape) != shape or out.dtype != g.dtype or not out.is_contiguous()
                                or out.device != g.device):
            raise MatmulInputError(f"out must be a contiguous {shape} {g.dtype} tensor on {g.device}, not "
                                   f"{tuple(out.shape)} {out.dtype}")
        if problem.m == 0:  # no routed rows (an expert-parallel rank given no tokens): every dW_e is 0
            return g.new_zeros(shape) if out is None else out.zero_()
        return self.run_grouped(problem, g, x, offs, out)

    def launch(self, plan: GroupedLaunch, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
               out: torch.Tensor | None = None, *, keep_workspace: bool = False,
               scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None) -> torch.Tensor:
        """Launch `plan` on its tensors (checked to pose its problem; block-wise fp8 ones with
        their scales, `grouped_scales`) on the current stream.

        The workspace (the per-group arrays, rebuilt from `offs` on the device by every
        launch) is, with `keep_workspace` and outside CUDA graph capture, this thread's for the
        device and stream, kept: calls on one stream run one after another, so one workspace
        serves them all. Otherwise it comes from torch's caching allocator for this call
        (released once the launch is enqueued). None is kept on the stream of torch.compile's
        CUDA graph trees either (`_may_keep`): what their warm-up allocates lands in their
        graphs' pool, which refuses memory held past a run. An instance initialized for the
        same problem, stream and addresses (operands, result, offsets, workspace) this thread
        has seen lately launches at once:
        its parameters hold nothing else, and every launch rebuilds the arrays it reads.

        Raises:
            KernelStatusError: CUTLASS refuses the problem.
        """
        device = plan.device
        if out is None:
            out = torch.empty(plan.out_shape, dtype=plan.out_dtype, device=a.device)
        stream = current_stream(device)
        local = self._local.__dict__
        workspace = None
        if keep_workspace and not torch.cuda.is_current_stream_capturing():
            kept = local.setdefault("workspaces", {})
            workspace = kept.get((device, stream))
            if workspace is None or workspace.numel() < plan.workspace_bytes:
                workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=a.device)
                if _may_keep(device, stream):
                    kept[(device, stream)] = workspace
        elif plan.workspace_bytes:
            workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=a.device)
        space = 0 if workspace is None else workspace.data_ptr()
        key = (plan, stream, a.data_ptr(), b.data_ptr(), out.data_ptr(), offs.data_ptr(), space,
               0 if scale_a is None else scale_a.data_ptr(), 0 if scale_b is None else scale_b.data_ptr())
        ready: collections.OrderedDict | None = local.get("ready")
        if ready is None:
            ready = local["ready"] = collections.OrderedDict()
        instance = ready.get(key)
        if instance is None:
            bind_primary_context(device)
            args = GemmArgs.from_buffer_copy(plan.args)
            args.a, args.b, args.d, args.c, args.offsets = key[2], key[3], key[4], key[4], key[5]
            args.scale_a, args.scale_b = key[7] or None, key[8] or None
            # The least recently used instance is re-initialized rather than a new one made.
            instance = ready.popitem(last=False)[1] if len(ready) >= READY_GROUPED else self.kernel.create()
            try:
                instance.initialize(args, space or None, stream)
            except KernelStatusError:
                instance.close()
                raise
            ready[key] = instance
        else:
            ready.move_to_end(key)
        instance.run(stream)
        return out


KERNEL_CLASSES[Kind.GROUPED] = GroupedGemm


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, *, table: BestTable | str | Path,
               out_dtype: torch.dtype | None = None, scale_a: torch.Tensor | None = None,
               scale_b: torch.Tensor | None = None, keep_workspace: bool = True,
               min_ratio: float = _MIN_RATIO, activation: Activation | str = Activation.NONE) -> torch.Tensor:
    """MoE experts' GEMMs in one launch: out[offs[e-1]:offs[e]] = a[offs[e-1]:offs[e]] @ b[e]
    through the table's tuned grouped kernel for these experts (torch._grouped_mm's 2D x 3D
    case; see the module docstring for the operands).

    The table's rows of the same operation (dtypes, b's layout) and the same experts E, N
    and K are looked up; among them the one whose routed rows are nearest M runs (every kernel
    is right for every routing; only its speed was measured at that one). Where the table has
    none, where that row's ratio to torch's grouped GEMM is below `min_ratio` (torch kept where
    it wins, as `patch` keeps cuBLAS), or where CUTLASS cannot run the problem, torch's grouped
    GEMM computes it (`torch_grouped_mm`; for block-wise fp8, `torch_blockwise_grouped_mm`) and a
    warning says so once per cause. The first call
    for a shape looks it up and prepares its launch; later calls with the same shapes, strides
    and dtypes take it from a dict and go straight to the launch (no initialization where the
    addresses repeat: `GroupedGemm.launch`).

    Args:
        a: M x K row-major, bfloat16, float16 or float8_e4m3fn (with scales), the rows sorted by
            expert.
        b: E x K x N of a's dtype: `w.transpose(-2, -1)` of an E x N x K weight stack, or
            contiguous (16-bit only). N and K multiples of 8 (16 for fp8; K of 128 with scales).
        offs: E int32 cumulative row ends, on a's device.
        table: a `BestTable`, or what `BestTable.load` reads (loaded once per path).
        out_dtype: the result's type (bfloat16, float16, float32); None: a's type (bfloat16 for
            fp8, its only one).
        scale_a: fp8 only: float32 M x K/128 row-major, one per 1 x 128 group of a's rows.
        scale_b: fp8 only: float32 E x N/128 x K/128 contiguous, one per 128 x 128 block of each
            expert's N x K weight (or its transpose(-2, -1) view).
        keep_workspace: keep one workspace per thread, device and stream (outside CUDA graph
            capture and torch.compile's CUDA graph trees) instead of one from torch's allocator
            per call.
        min_ratio: run torch's grouped GEMM where the table's row measured the kernel at less
            than this ratio to it (a row with no ratio counts as below); 0 runs every kernel
            the table has.
        activation: applied to every output element in the kernel's epilogue (an `Activation`
            or its name; 16-bit inputs only); torch's path applies it after its grouped GEMM.

    Returns:
        M x N of `out_dtype`, row-major.

    Raises:
        MatmulInputError: operands that are not CUDA tensors, unsupported dtypes, shapes that
            do not multiply, offs that are not E int32 values, N or K not multiples of 8,
            misaligned or strided operands; fp8 without both scales, scales of 16-bit inputs,
            scales of the wrong shape, dtype, device or layout.
    """
    # As in `matmul`, each test's first half is the common call's, by identity.
    if not ((type(a) is _TENSOR or isinstance(a, torch.Tensor)) and (type(offs) is _TENSOR
                                                                      or isinstance(offs, torch.Tensor))):
        name, t = ("a", a) if not isinstance(a, torch.Tensor) else ("offs", offs)
        raise MatmulInputError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if type(table) is not BestTable:
        table = table if isinstance(table, BestTable) else load_table(str(table))
    native = _native.door
    if (native is not None and scale_a is scale_b is None and (activation is _NO_ACTIVATION or activation == "none")
            and (type(b) is _TENSOR or isinstance(b, torch.Tensor))
            and (out_dtype is None or isinstance(out_dtype, torch.dtype))
            and (min_ratio is _MIN_RATIO or isinstance(min_ratio, (int, float)))
            and not _profiler_enabled()):
        # The native library's path: the same plan, checked and resolved once per signature.
        return native.grouped_mm(a, b, offs, table.plans.native_key or _native.door_key(table), out_dtype,
                                 keep_workspace if keep_workspace is True else bool(keep_workspace), min_ratio)
    return run_grouped(table, a, b, offs, out_dtype, keep_workspace, min_ratio, scale_a=scale_a, scale_b=scale_b,
                       activation=activation)


def _scale_key(t: object) -> object:
    """A scale's part of a call's cache key: what `grouped_scales` checks of it."""
    return (t.shape, t.stride(), t.dtype, t.device) if isinstance(t, torch.Tensor) else t


def grouped_signature(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype | None,
                      min_ratio: float, keep_workspace: bool, activation: Activation | str = Activation.NONE,
                      pair: Pair = Pair.NONE, scale_a: object = None, scale_b: object = None) -> tuple:
    """A grouped call's plan signature (`run_grouped`'s, the native doors' resolvers'): what the
    plan depends on. A GLU pair shares the activation's place in the key, so the signatures of
    plain calls are the operator's (`_grouped_op._signature`) as they were."""
    return ("grouped", a.get_device(), a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, offs.shape,
            offs.dtype, out_dtype, scale_a, scale_b, min_ratio, keep_workspace,
            activation if pair is Pair.NONE else (activation, pair))


def run_grouped(table: BestTable, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype | None,
                keep_workspace: bool, min_ratio: float, check: Callable[[], None] | None = None, *,
                scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
                activation: Activation | str = Activation.NONE, pair: Pair = Pair.NONE) -> torch.Tensor:
    """`grouped_mm` on a loaded table, for its callers' hot path (the operator's): `check`, if
    given, runs only where the call's signature has no plan yet (a signature found there passed
    it once; its checks are functions of the signature alone). `pair`: the GLU gate_up problem
    (`grouped_problem_of`), its result M x N/2."""
    device = a.get_device()
    signature = grouped_signature(a, b, offs, out_dtype, min_ratio, keep_workspace, activation, pair,
                                  _scale_key(scale_a), _scale_key(scale_b))
    ready = table.plans.get(signature)
    call = None
    if ready is None or not (device >= 0 and b.get_device() == device and offs.get_device() == device
                             and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0):
        if check is not None:
            check()
        problem = grouped_problem_of(a, b, offs, out_dtype, scale_a, scale_b, activation_of(activation), pair)
        call = Call(Kind.GROUPED, problem, device, min_ratio, signature, keep_workspace)
        ready = prepare(table, call)
    if _profiler_enabled():  # `tune-model` reads each problem's kernel time from this range
        with torch.profiler.record_function(PROFILER_RANGE + ready[0].problem.name):
            return _run_ready(table, ready, call, a, b, offs, keep_workspace, min_ratio, signature, scale_a, scale_b)
    return _run_ready(table, ready, call, a, b, offs, keep_workspace, min_ratio, signature, scale_a, scale_b)


def _run_ready(table: BestTable, ready: Ready, call: Call | None, a: torch.Tensor, b: torch.Tensor,
               offs: torch.Tensor, keep_workspace: bool, min_ratio: float, signature: tuple,
               scale_a: torch.Tensor | None, scale_b: torch.Tensor | None) -> torch.Tensor:
    plan, gemm, launch = ready
    if launch is not None:
        try:
            return cast(GroupedGemm, gemm).launch(launch, a, b, offs, keep_workspace=keep_workspace, scale_a=scale_a,
                                                  scale_b=scale_b)
        except KernelStatusError as err:
            call = call or Call(Kind.GROUPED, plan.problem, plan.device, min_ratio, signature, keep_workspace)
            plan = cannot_implement(table, call, ready, err).plan
    problem = plan.problem
    if problem.grouping is Grouping.GROUPED_K:  # a weight gradient (a = g, b = x): 0 for experts without rows
        return a.new_zeros(_out_shape(problem)) if problem.m == 0 else torch_weight_grad(a, b, offs)
    if problem.m == 0:
        return a.new_empty(problem.epilogue.output_shape(0, problem.n), dtype=TORCH_DTYPE[problem.dtype_d])
    return _torch_path(plan.problem, a, b, offs, scale_a, scale_b)


def _torch_path(problem: Problem, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                scale_a: torch.Tensor | None, scale_b: torch.Tensor | None) -> torch.Tensor:
    """torch's computation of a checked call: its grouped GEMM, after dequantizing block-wise fp8,
    then the epilogue's activation (of a GLU pair's gate, times its up)."""
    epilogue = problem.epilogue
    if epilogue.pair is not Pair.NONE:
        gate, up = glu_halves(torch_grouped_mm(a, b, offs, TORCH_DTYPE[problem.dtype_d]), epilogue.pair)
        return ACTIVATION[epilogue.activation](gate) * up
    activate = ACTIVATION[epilogue.activation]
    if problem.scaling is Scaling.BLOCKWISE:
        scales = grouped_scales(a, b, scale_a, scale_b)
        assert scales is not None, "a block-wise problem was posed by its scales"
        return activate(torch_blockwise_grouped_mm(a, b, offs, *scales))
    return activate(torch_grouped_mm(a, b, offs, TORCH_DTYPE[problem.dtype_d]))


def _resolve_door(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, key: str, out_dtype: torch.dtype | None,
                  keep_workspace: bool, min_ratio: float) -> tuple:
    """The native plan entry of a `grouped_mm` call without scales or activation
    (`_native.register_door`): the door's checks (raising as the door does), its plan by the
    door's signature, its kernel, torch's grouped GEMM where the table keeps torch and the result
    is a's type, else the Python door."""
    table = _native.door_table(key)
    device = a.get_device()
    problem = grouped_problem_of(a, b, offs, out_dtype, None, None, Activation.NONE)
    signature = grouped_signature(a, b, offs, out_dtype, min_ratio, keep_workspace)
    ready = table.plans.get(signature) or prepare(table, Call(Kind.GROUPED, problem, device, min_ratio, signature,
                                                              keep_workspace))
    return _native.plan_entry(ready, torch_path=out_dtype in (None, a.dtype))


def _door(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, key: str, out_dtype: torch.dtype | None,
          keep_workspace: bool, min_ratio: float) -> torch.Tensor:
    return run_grouped(_native.door_table(key), a, b, offs, out_dtype, keep_workspace, min_ratio)


_native.register_door("grouped_mm door", _resolve_door, _door)
# The door's native path (`_native.door`) is there once the library is loaded: with the door's own
# import, so a process that calls the door and never imports the operators launches from C++ too.
_native.load()
