"""`inductor_options`: a torch.compile pass that puts the tuned fused kernels into a model
without changing its code.

    model = torch.compile(model, options=cutlass_tune.inductor_options(table))

The pass runs on Inductor's post-grad graph (aten ops, normalized and functionalized; its
`post_grad_custom_post_pass`) and rewrites, into one call of `torch.ops.cutlass_tune.linear`:

- a Linear's GEMM (`mm`, or `addmm` with a bias of N values; on x as it is, or on x viewed as
  M x K and the product viewed back, as a 3-D input's nn.Linear runs) followed by a ReLU, an erf
  or tanh GELU or a SiLU (as Inductor decomposes them), where nothing else reads the
  pre-activation: `bias+gelu`, `silu`, ...;
- such a GEMM added to a tensor of its output's shape (a residual stream: o_proj, down_proj,
  fc2): `residual`, `bias+residual`;
- a gated product act(x Wg^T) * (x Wu^T) of two GEMMs of the same x: the up GEMM with the gate
  GEMM's output as its gate, `silu+gated` (the gate GEMM stays, as Inductor compiles it);
- a Linear with a bias alone: `bias`.

Each only where the table has a winner for the fused problem: an entry of that epilogue, dtype
(bf16 or f16 in and out), layout tn, N and K (M is the tokens of a call and may be dynamic: the
operator runs the entry of the nearest tuned M) whose ratio to torch eager, to the strongest
torch path (eager, torch.compile or cuBLASLt's epilogue) and to torch.compile, where the table
has those figures, is at least `min_ratio`. A training graph keeps the pre-activation
for its backward, so its activations stay as they were; its residual adds are fused (their
backward needs no value of the forward). Everything else stays as Inductor compiles it.
`FusionPass.decisions` lists what each compiled graph had, fused or not and why.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from .._torch import ACTIVATION, DTYPE_OF
from ..space import Activation, DType, Epilogue
from . import _lowering
from ._dispatch import device_table
from ._op import registered_table, table_key
from ._patch import MIN_KERNEL_US, _Coverage, operator_takes
from ._table import BestTable

_log = logging.getLogger(__name__)
_aten = torch.ops.aten
_LINEAR = torch.ops.cutlass_tune.linear.default
_VERSION = "cutlass_tune.inductor 1"
"""Part of the pass's cache key: change it when the rewrite changes."""


def _of_z(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda z: fn(z)  # one argument: tracing counts a partial's bound keywords as inputs


_TRACED: dict[Activation, Callable[[torch.Tensor], torch.Tensor]] = {
    a: _of_z(fn) for a, fn in ACTIVATION.items() if a is not Activation.NONE}
"""The activations the pass fuses: every one but NONE, as torch computes it (`_torch.ACTIVATION`)."""
_HALF = (DType.BF16, DType.F16)


@functools.cache
def _activation_patterns() -> dict[Activation, Any]:
    """Each activation as the post-grad graph holds it (Inductor's decompositions, bf16 and f16
    upcast to float32 and back), as a pattern of the input `z`. Constants are kept, so only
    the activation itself matches."""
    from torch._inductor.pattern_matcher import fwd_only, fx_to_pattern

    patterns = {}
    for activation, fn in _TRACED.items():
        gm = fwd_only(fn, [torch.empty(8, 16, dtype=torch.bfloat16)])
        patterns[activation] = fx_to_pattern(gm, ignore_types=(torch.dtype,), argnames=("z",))
    return patterns


@dataclasses.dataclass(frozen=True)
class _Linear:
    """A Linear's GEMM found in the graph: x [..., K] by weight N x K (+ bias), giving `out`."""

    x: torch.fx.Node
    weight: torch.fx.Node
    bias: torch.fx.Node | None
    out: torch.fx.Node
    nodes: tuple[torch.fx.Node, ...]
    """The GEMM's own nodes (views, permute, mm), `out` included: gone once it is fused."""


@dataclasses.dataclass(frozen=True)
class FusionDecision:
    """What the pass did with one fusable site of a compiled graph."""

    epilogue: str
    dtype: str
    n: int
    k: int
    fused: bool
    reason: str

    def __str__(self) -> str:
        state = "fused" if self.fused else "left "
        return f"{state}  {self.dtype} {self.epilogue} N={self.n} K={self.k}: {self.reason}"


def _val(node: Any) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is(node: Any, target: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == target


def _only_user(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return list(node.users) == [user]


def _linear_of(node: Any) -> _Linear | None:
    """The Linear whose output `node` is: [reshape] (addmm(bias, x2, permute(w)) | mm(x2, permute(w)))
    [reshape], x2 being x or x viewed as M x K; None for anything else."""
    if not isinstance(node, torch.fx.Node):
        return None
    out, nodes = node, [node]
    gemm: Any = node  # fx's Argument union: each use is checked with _is first
    if _is(node, _aten.reshape.default):
        gemm = node.args[0]
        if not isinstance(gemm, torch.fx.Node) or not _only_user(gemm, node):
            return None
        nodes.append(gemm)
    bias: Any
    x2: Any
    wt: Any
    if _is(gemm, _aten.mm.default) and not gemm.kwargs:
        bias, (x2, wt) = None, tuple(gemm.args)
    elif _is(gemm, _aten.addmm.default) and not gemm.kwargs and len(gemm.args) == 3:
        bias, x2, wt = gemm.args
    else:
        return None
    if not _is(wt, _aten.permute.default) or list(wt.args[1]) != [1, 0] or not _only_user(wt, gemm):
        return None
    weight: Any = wt.args[0]
    x: Any = x2
    nodes.append(wt)
    if x2 is not node and _is(x2, _aten.reshape.default) and gemm is not node and _only_user(x2, gemm):
        x = x2.args[0]
        nodes.append(x2)
    values = [_val(n) for n in (x, weight, out)]
    if any(v is None for v in values):
        return None
    xv, wv, ov = values
    assert xv is not None and wv is not None and ov is not None  # checked above
    if wv.dim() != 2 or xv.dim() < 1 or xv.shape[-1] != wv.shape[1] or not wv.is_contiguous():
        return None
    if tuple(ov.shape) != (*xv.shape[:-1], wv.shape[0]):
        return None  # the product viewed as another shape than x's rows by N
    if bias is not None:
        bv = _val(bias)
        if bv is None or tuple(bv.shape) != (wv.shape[0],) or bv.dtype != wv.dtype:
            return None  # a C of M x N (a residual addmm) or another type: not a Linear's bias
    if xv.dtype != wv.dtype or DTYPE_OF.get(wv.dtype) not in _HALF:
        return None
    return _Linear(x, weight, bias, out, tuple(nodes))


def _activation_of(node: Any) -> tuple[Activation, torch.fx.Node, tuple[torch.fx.Node, ...]] | None:
    """The activation whose result `node` is: (activation, its input, its nodes); None if none is."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    from torch._inductor.pattern_matcher import is_match

    for activation, pattern in _activation_patterns().items():
        match = pattern.match(node)
        if is_match(match):
            z = match.kwargs["z"]
            inside = set(match.nodes)
            read = [u for n in inside if n is not node for u in n.users]  # the pattern's own users checked again
            if isinstance(z, torch.fx.Node) and all(u in inside for u in [*z.users, *read]):
                return activation, z, tuple(match.nodes)
    return None


class FusionPass(CustomGraphPass):
    """The post-grad pass of `inductor_options` (module docstring); Inductor caches what it
    compiled under `uuid()`.

    Args:
        table: a `BestTable`, a path `BestTable.load` reads, or a key from `register_table`.
        min_ratio: the ratio to torch (and to torch.compile, where the table has it) a fused
            entry must reach; 0 takes every entry.
        cuda_only: leave GEMMs that are not on CUDA (False: rewrite them too; off CUDA the
            operator computes torch's math, which is what the CPU tests run).
        min_kernel_us: leave a site whose entries' kernels all take less than this many
            microseconds a call: a compiled graph calls the operator through the dispatcher and
            its Python path (`patch`'s argument of the same name); 0 where the graph runs under
            CUDA graphs (mode="reduce-overhead").
    """

    def __init__(self, table: BestTable | str | Path, *, min_ratio: float = 1.0, cuda_only: bool = True,
                 min_kernel_us: float = MIN_KERNEL_US):
        self.key = table_key(table)
        self.min_ratio = float(min_ratio)
        self.min_kernel_us = float(min_kernel_us)
        self.cuda_only = cuda_only
        self.decisions: list[FusionDecision] = []
        self._coverage: dict[tuple[int, str], _Coverage] = {}

    def uuid(self) -> bytes:
        """Inductor's cache key for the pass: its version, the table's rows, the options and the
        operator's arguments (a graph compiled with another table is compiled again)."""
        import pandas as pd

        digest = hashlib.sha256(f"{_VERSION} {self.key} {self.min_ratio} {self.min_kernel_us} {self.cuda_only} "
                                f"{_LINEAR._schema}".encode())
        frame = registered_table(self.key).frame
        digest.update(pd.util.hash_pandas_object(frame.astype(str), index=False).to_numpy().tobytes())
        return digest.digest()

    def __call__(self, graph: torch.fx.Graph) -> None:
        _lowering.ensure("linear")  # the linear calls this pass puts in are lowered as extern kernels
        taken: set[torch.fx.Node] = set()
        fused = 0
        for node in reversed(list(graph.nodes)):  # users first: the widest pattern claims its nodes
            if node in taken or node.op != "call_function":
                continue
            site = self._site(node)
            if site is None:
                continue
            epilogue, linear, extra, nodes = site
            if taken.intersection(nodes) or taken.intersection(linear.nodes):
                continue
            if self._fuse(graph, node, epilogue, linear, extra):
                taken.update(nodes, linear.nodes)
                fused += 1
        if fused:
            graph.eliminate_dead_code()

    def _site(self, node: torch.fx.Node) -> tuple[Epilogue, _Linear, dict[str, torch.fx.Node],
                                                  tuple[torch.fx.Node, ...]] | None:
        """The fusion `node` ends, if any: (epilogue, the Linear, residual or gate, nodes replaced)."""
        if _is(node, _aten.mul.Tensor) and len(node.args) == 2 and not node.kwargs:
            pairs: Any = (node.args, node.args[::-1])
            for gate_side, up_side in pairs:
                found = _activation_of(gate_side)
                up = _linear_of(up_side)
                if found is None or up is None or not _only_user(up.out, node):
                    continue
                activation, z, act_nodes = found
                gate = _linear_of(z)
                if gate is None or gate.x is not up.x or not _only_user(gate_side, node):
                    continue
                if tuple(_val(z).shape) != tuple(_val(up.out).shape):  # type: ignore[union-attr]
                    continue
                epilogue = Epilogue(bias=up.bias is not None, activation=activation, gated=True)
                return epilogue, up, {"gate": z}, (node, *act_nodes)
        if _is(node, _aten.add.Tensor) and len(node.args) == 2 and not node.kwargs:
            sides: Any = (node.args, node.args[::-1])
            for side, other in sides:
                linear = _linear_of(side)
                if linear is None or not _only_user(linear.out, node):
                    continue
                ov, rv, nv = _val(linear.out), _val(other), _val(node)
                if ov is None or rv is None or nv is None or rv.shape != ov.shape or rv.dtype != ov.dtype \
                        or nv.shape != ov.shape:
                    continue
                return Epilogue(bias=linear.bias is not None, residual=True), linear, {"residual": other}, (node,)
        found = _activation_of(node)
        if found is not None:
            activation, z, act_nodes = found
            linear = _linear_of(z)
            if linear is not None:
                return Epilogue(bias=linear.bias is not None, activation=activation), linear, {}, act_nodes
        linear = _linear_of(node)
        if linear is not None and linear.bias is not None:
            viewed = list(node.users)
            if len(viewed) == 1 and _linear_of(viewed[0]) is not None:
                return None  # the GEMM of a Linear whose output is the view: the view was the site
            return Epilogue(bias=True), linear, {}, ()
        return None

    def _fuse(self, graph: torch.fx.Graph, root: torch.fx.Node, epilogue: Epilogue, linear: _Linear,
              extra: dict[str, torch.fx.Node]) -> bool:
        """Replace `root` by one operator call where the table has a winner; record the decision."""
        wv = _val(linear.weight)
        assert wv is not None  # _linear_of checked it
        dtype = DTYPE_OF[wv.dtype]
        n, k = wv.shape
        why = self._why_not(wv.device, dtype, epilogue, n, k)
        for argument in extra:
            if why is None and not operator_takes(argument):
                why = f"torch.ops.cutlass_tune.linear takes no {argument} argument in this build"
        if why is not None:
            self._decide(epilogue, dtype, n, k, False, why)
            return False
        args = (linear.x, linear.weight, linear.bias, epilogue.activation.value, self.key)
        with graph.inserting_before(root):
            fused = graph.call_function(_LINEAR, args, dict(extra))
        fused.meta.update({k: v for k, v in root.meta.items() if k in ("stack_trace", "nn_module_stack")})
        fused.meta["val"] = self._fake(args, extra)
        root.replace_all_uses_with(fused)
        self._decide(epilogue, dtype, n, k, True,
                     self._coverage_of(wv.device, epilogue).covering(dtype, n, k))
        return True

    @staticmethod
    def _fake(args: tuple, extra: dict[str, torch.fx.Node]) -> torch.Tensor:
        """The new node's value, from the operator's fake implementation in the graph's fake mode."""
        from torch._guards import detect_fake_mode

        def value(a: Any) -> Any:
            return _val(a) if isinstance(a, torch.fx.Node) else a

        values, kwargs = [value(a) for a in args], {k: value(v) for k, v in extra.items()}
        mode = detect_fake_mode([v for v in (*values, *kwargs.values()) if isinstance(v, torch.Tensor)])
        with mode if mode is not None else torch._subclasses.FakeTensorMode():
            return _LINEAR(*values, **kwargs)

    def _why_not(self, device: torch.device, dtype: DType, epilogue: Epilogue, n: int, k: int) -> str | None:
        if self.cuda_only and device.type != "cuda":
            return f"on {device}: the tuned kernels run on CUDA"
        return self._coverage_of(device, epilogue).why_not(dtype, n, k, self.min_ratio, self.min_kernel_us)

    def _coverage_of(self, device: torch.device, epilogue: Epilogue) -> _Coverage:
        index = device.index if device.type == "cuda" and device.index is not None else -1
        if device.type == "cuda" and index < 0:
            index = torch.cuda.current_device()
        cached = self._coverage.get((index, epilogue.name))
        if cached is None:
            tuned = registered_table(self.key)
            rows = tuned if index < 0 else device_table(tuned, index, "inductor_options")
            cached = _Coverage(rows.frame, epilogue, ratios=("ratio", "strongest_ratio", "torch_compile_ratio"))
            self._coverage[(index, epilogue.name)] = cached
        return cached

    def _decide(self, epilogue: Epilogue, dtype: DType, n: int, k: int, fused: bool, reason: str) -> None:
        decision = FusionDecision(epilogue.name, dtype.value, n, k, fused, reason)
        self.decisions.append(decision)
        _log.info("cutlass_tune.inductor_options: %s", decision)


def inductor_options(table: BestTable | str | Path, *, min_ratio: float = 1.0, cuda_only: bool = True,
                     min_kernel_us: float = MIN_KERNEL_US) -> dict[str, Any]:
    """torch.compile options that rewrite fusable GEMMs into the table's fused kernels
    (module docstring): `torch.compile(model, options=inductor_options(table))`.

    Merge them with options of your own (`{**inductor_options(table), "max_autotune": True}`);
    they set Inductor's `post_grad_custom_post_pass`, so a pass of your own there is replaced.

    Args:
        table: a `BestTable`, a path `BestTable.load` reads, or a key from `register_table`.
        min_ratio, cuda_only, min_kernel_us: as `FusionPass`.

    Returns:
        {"post_grad_custom_post_pass": FusionPass(...)}.

    Raises:
        UnregisteredTableError: a string that is neither a registered key nor a readable table.
        BestTableError, BundleError, StoreError: a table path that cannot be read.
    """
    return {"post_grad_custom_post_pass": FusionPass(table, min_ratio=min_ratio, cuda_only=cuda_only,
                                                     min_kernel_us=min_kernel_us)}


def fusion_decisions(options: dict[str, Any]) -> Iterable[FusionDecision]:
    """The decisions the pass of `inductor_options(...)` made so far, in compile order."""
    found = options.get("post_grad_custom_post_pass")
    return tuple(found.decisions) if isinstance(found, FusionPass) else ()
