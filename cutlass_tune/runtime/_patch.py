"""`patch`: swap the nn.Linear layers of a model that a best-config table covers.

A layer is covered when the table has at least one entry for its GEMM: its weight's dtype
(bfloat16 or float16) as input and output type, layout tn (x row-major, the N x K weight
row-major: nn.Linear's), and N = out_features, K = in_features. M (the tokens of a batch)
varies from call to call, so it plays no part: `matmul` runs the entry of the nearest tuned M.
A covered layer is swapped where one of its entries beats cuBLAS by the table's own figure
(`min_ratio`), so a patch never trades torch's GEMM for one the table measured slower.

A layer with a bias is covered by the table's `bias` entries (the GEMM with the bias added in its
epilogue), measured against what torch runs for it, F.linear, whose cuBLASLt call adds the bias in
its own epilogue: the tuned GEMM then a separate bias add would be a pass over the output more
than torch makes. The swapped layer runs the fused-bias kernel (`Linear.fused_bias`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from .._torch import TORCH_DTYPE
from ..measurement import TimingMethod
from ..space import ACTIVATIONS, Activation, DType, Epilogue, Problem, activation_of_module_class, check_problem
from ._dispatch import device_table, eager_direct_allowed
from ._linear import Linear
from ._matmul import MatmulInputError
from ._op import linear_direct, registered_table, table_key
from ._table import BestTable

_DTYPES = {TORCH_DTYPE[d]: d for d in (DType.BF16, DType.F16)}
_LISTED = 6
"""Tuned shapes a report names at most, where a layer finds none of its own."""


@dataclasses.dataclass(frozen=True)
class LayerDecision:
    """What `patch` did with one nn.Linear, and why."""

    name: str
    """The layer's qualified name in the model ("" for the model itself)."""
    in_features: int
    out_features: int
    dtype: torch.dtype
    device: torch.device
    swapped: bool
    reason: str
    """For a swapped layer, the entries that cover it; for one left, what it lacks."""
    fused: str = ""
    """The epilogue the layer runs fused with what followed it ("bias+gelu", "silu+gated"); ""
    where it runs its GEMM alone."""
    fusion: str = ""
    """Where the structure showed an activation or gate after the layer: what was fused with it,
    or why not."""


@dataclasses.dataclass(frozen=True)
class PatchReport:
    """The decisions of one `patch` call, one per nn.Linear in the model's `named_modules`
    order (a module reached by two names is listed under both)."""

    table: str
    """The registry key the swapped layers call the operator with."""
    layers: tuple[LayerDecision, ...]

    @property
    def swapped(self) -> tuple[LayerDecision, ...]:
        return tuple(d for d in self.layers if d.swapped)

    @property
    def fused(self) -> tuple[LayerDecision, ...]:
        return tuple(d for d in self.layers if d.fused)

    @property
    def left(self) -> tuple[LayerDecision, ...]:
        return tuple(d for d in self.layers if not d.swapped)

    def __str__(self) -> str:
        head = (f"cutlass_tune.patch (table {self.table!r}): {len(self.swapped)} of {len(self.layers)} "
                "Linear layers swapped" + (f", {len(self.fused)} fused with what follows" if self.fused else ""))
        names = [d.name or "(model)" for d in self.layers]
        shapes = [f"{d.in_features}->{d.out_features} {str(d.dtype).removeprefix('torch.')}" for d in self.layers]
        wide = max(map(len, names), default=0), max(map(len, shapes), default=0)
        lines = [f"  {'fused  ' if d.fused else 'swapped' if d.swapped else 'left   '}  {name:<{wide[0]}}  "
                 f"{shape:<{wide[1]}}  {d.reason}" + (f"; {d.fusion}" if d.fusion and not d.fused else "")
                 for d, name, shape in zip(self.layers, names, shapes)]
        return "\n".join([head, *lines])


class _Coverage:
    """The tn entries of one epilogue in a table whose input and output types match, by
    (dtype, N, K): plain ones (epilogue none, as nn.Linear's GEMM) by default, or those of a fused
    epilogue (`epilogue`) for a Linear fused with what follows it. Scaled fp8 entries compute
    another function and are never counted.

    `ratios`: the columns whose smallest finite value is an entry's ratio (the table's `ratio`
    and `strongest_ratio`, its ratio to the fastest torch path of the same math: eager,
    torch.compile or cuBLASLt's epilogue; a compiled model's pass adds `torch_compile_ratio`),
    where the entry has no `in_model_ratio` or `call_site_ratio`, which come first."""

    def __init__(self, frame: pd.DataFrame, epilogue: Epilogue = Epilogue(),
                 ratios: tuple[str, ...] = ("ratio", "strongest_ratio")):
        self.frame = frame
        """The rows it was built from, all epilogues: a fused coverage of the same device starts there."""
        self.epilogue = epilogue
        self.tuned: dict[tuple[str, int, int], list[tuple[int, float]]] = defaultdict(list)
        self.kernel_us: dict[tuple[str, int, int], list[tuple[int, float]]] = defaultdict(list)
        """Per (dtype, N, K): (M, the entry kernel's microseconds a call), NaN where unknown."""
        if frame.empty:
            return
        rows = frame[(frame["layout"] == "tn") & (frame["dtype_a"] == frame["dtype_d"])
                     & (frame["epilogue"] == epilogue.name) & (frame["scaling"] == "none")]
        columns = [rows[c] if c in rows.columns else pd.Series(math.nan, index=rows.index) for c in ratios]
        ratio = pd.concat(columns, axis=1).astype(float).min(axis=1, skipna=True)
        # The figures the dispatcher prefers to a claim, in its order (`Match.dispatch_ratio`): the
        # kernel's ratio inside the model (`tune-model`), else at the call site (`check`).
        # A call-site figure only holds a kernel below its claim (as `Match.dispatch_ratio`).
        for column in ("call_site_ratio", "in_model_ratio"):
            if column in rows.columns:
                measured = pd.to_numeric(rows[column], errors="coerce").astype(float)
                if column == "call_site_ratio":
                    measured = measured.where(~(measured > ratio), ratio)
                ratio = measured.where(measured.map(math.isfinite), ratio)
        if "method" in rows.columns:  # a claim of single launches alone holds nothing (as `Match.dispatch_ratio`)
            figures = [pd.to_numeric(rows[c], errors="coerce").astype(float).map(math.isfinite)
                       for c in ("call_site_ratio", "in_model_ratio") if c in rows.columns]
            measured_here = pd.concat(figures, axis=1).any(axis=1) if figures else False
            single = (rows["method"].astype(str) == TimingMethod.EVENTS.value) & ~measured_here
            ratio = ratio.where(~single, math.nan)
        ms = rows["median_ms"] if "median_ms" in rows.columns else pd.Series(math.nan, index=rows.index)
        for dtype, n, k, m, r, t in zip(rows["dtype_a"], rows["n"], rows["k"], rows["m"], ratio, ms.astype(float)):
            self.tuned[(str(dtype), int(n), int(k))].append((int(m), float(r)))
            self.kernel_us[(str(dtype), int(n), int(k))].append((int(m), float(t) * 1e3))

    def _named(self, dtype: DType) -> str:
        """"bf16 tn", or "bf16 tn bias+gelu" for a fused epilogue."""
        return f"{dtype.value} tn" + ("" if self.epilogue.is_plain else f" {self.epilogue.name}")

    def why_not(self, dtype: DType, n: int, k: int, min_ratio: float, min_kernel_us: float = 0.0) -> str | None:
        """None where the table covers N x K of `dtype` with an entry at `min_ratio` of its
        baseline or faster whose kernel takes `min_kernel_us` or more (where the table knows its
        time), else what it has instead."""
        named = self._named(dtype)
        baseline = "cuBLAS" if self.epilogue.is_plain else "torch"
        entries = self.tuned.get((dtype.value, n, k))
        if entries and min_kernel_us > 0:
            times = self.kernel_us[(dtype.value, n, k)]
            if all(us < min_kernel_us for _, us in times):  # NaN (unknown) compares False: kept
                m, us = max(times, key=lambda mu: mu[1])
                kept = "torch's GEMM is kept" if self.epilogue.is_plain else "torch's path is kept"
                return (f"{named} N={n}, K={k}: its kernel takes {us:.0f} us at M = {m}, under min_kernel_us "
                        f"{min_kernel_us:g}, the host time of a call ({kept}; under CUDA graphs the host "
                        "drops out: pass min_kernel_us=0)")
        if entries:
            best = max((r for _, r in entries if math.isfinite(r)), default=math.nan)
            if min_ratio <= 0 or best >= min_ratio:
                return None
            if math.isnan(best):
                return (f"{named} N={n}, K={k}: the table has no ratio to {baseline} to hold to min_ratio {min_ratio} "
                        "(a sweep's single launches alone are not one: `cutlass-tune confirm` the table's store)")
            kept = "torch's GEMM is kept" if self.epilogue.is_plain else "torch's path is kept"
            return (f"{named} N={n}, K={k}: tuned at {best:.3f}x {baseline} at best, below min_ratio "
                    f"{min_ratio} ({kept})")
        shapes = sorted({(sn, sk) for d, sn, sk in self.tuned if d == dtype.value})
        if not shapes:
            has = sorted({d for d, _, _ in self.tuned})
            if not has and not self.epilogue.is_plain:
                return f"the table has no {named.partition(' ')[2]} entries"
            return (f"the table has no {named} entries (it has {named.partition(' ')[2]} entries for: "
                    f"{', '.join(has) or 'none'})")
        listed = ", ".join(f"{sn}x{sk}" for sn, sk in shapes[:_LISTED])
        more = f" and {len(shapes) - _LISTED} more" if len(shapes) > _LISTED else ""
        return f"no {named} entry for N={n}, K={k} (N x K tuned: {listed}{more})"

    def covering(self, dtype: DType, n: int, k: int) -> str:
        """The entries of N x K of `dtype`, in words."""
        entries = sorted(self.tuned[(dtype.value, n, k)])
        text = f"{self._named(dtype)} N={n}, K={k} tuned at M = {', '.join(str(m) for m, _ in entries)}"
        ratios = [r for _, r in entries if math.isfinite(r)]
        baseline = "cuBLAS" if self.epilogue.is_plain else "torch"
        if ratios:
            low, high = f"{min(ratios):.2f}", f"{max(ratios):.2f}"
            text += f" ({low}x {baseline})" if low == high else f" ({low}-{high}x {baseline})"
        return text


def _why_left(name: str, linear: torch.nn.Linear, coverage: _Coverage | None, cuda_only: bool,
              min_ratio: float, min_kernel_us: float = 0.0) -> str | None:
    """Why `linear` stays as it is; None when it is swapped (`coverage` None: whatever the table has)."""
    if isinstance(linear, Linear):
        return f"already a cutlass_tune.nn.Linear (table {linear.table_key!r})"
    if type(linear) is not torch.nn.Linear:
        return f"a subclass of nn.Linear ({type(linear).__name__}): its own forward is kept"
    if not name:
        return "the model itself: patch a module that holds it, or use cutlass_tune.nn.Linear.from_linear"
    weight = linear.weight
    if cuda_only and weight.device.type != "cuda":
        return f"on {weight.device}: the tuned kernels run on CUDA (move the model there first)"
    dtype = _DTYPES.get(weight.dtype)
    if dtype is None:
        return f"{weight.dtype}: the tuned kernels take bfloat16 or float16 (cast the model first)"
    n, k = linear.out_features, linear.in_features
    refused = check_problem(Problem(1, n, k, dtype_a=dtype, dtype_b=dtype, dtype_d=dtype))
    if refused:
        return refused[0].reason
    return None if coverage is None else coverage.why_not(dtype, n, k, min_ratio, min_kernel_us)


MIN_KERNEL_US = 150.0
"""`patch`'s and `inductor_options`' default `min_kernel_us`."""



def _resolve(dotted: str) -> object:
    found: object = torch
    for part in dotted.split(".")[1:]:
        found = getattr(found, part)
    return found


_FUNCTIONS = {_resolve(name): activation for activation, facets in ACTIVATIONS.items() for name in facets.functions}
"""The functions computing each activation (`ActivationFacets.functions`)."""
_PAIRS = (("dense", "intermediate_act_fn"), ("dense_h_to_4h", "act"), ("fc_in", "act"))
"""(Linear, activation) attributes of modules whose forward applies the activation to the
Linear's output and nothing else reads it: BERT's (and ViT's) Intermediate, GPT-NeoX's MLP, GPT-J's MLP."""
_GATED = ("gate_proj", "up_proj", "down_proj", "act_fn")
"""A gated MLP's attributes (LLaMA, Qwen, Mistral, Gemma): down_proj(act_fn(gate_proj(x)) * up_proj(x))."""


def activation_of_module(value: object) -> Activation | None:
    """The activation an activation module (or function) computes, where it is one the fused
    kernels compute (`ActivationFacets.modules` and `functions`: nn.ReLU, nn.GELU (erf or
    tanh), nn.SiLU, transformers' GELUActivation (erf), GELUTanh, NewGELUActivation,
    FastGELUActivation (tanh) and SiLUActivation, F.relu, F.gelu, F.silu, and F.gelu with its
    keywords bound); None for anything else, and for a module working in place."""
    if getattr(value, "inplace", False) is True:
        return None
    if isinstance(value, functools.partial) and not value.args:
        if not value.keywords:
            return _FUNCTIONS.get(value.func)
        return next((a for a, facets in ACTIVATIONS.items() if facets.torch
                     and getattr(F, facets.torch) is value.func and dict(facets.kwargs) == value.keywords), None)
    if isinstance(value, torch.nn.Module):
        return activation_of_module_class(tuple(c.__name__ for c in type(value).__mro__),
                                          lambda name, default: getattr(value, name, default))
    return _FUNCTIONS.get(value) if callable(value) else None


class GatedMLP(torch.nn.Module):
    """A gated MLP whose up projection runs fused with the gate: down_proj(linear(x, up_proj's
    weight and bias, activation, gate=gate_proj(x))), one kernel for act(gate) * (x Wu^T + b).

    Holds the MLP's own gate_proj, up_proj, down_proj and act_fn (same parameters, same
    state_dict keys). Where a gradient is needed it computes the MLP as it was (torch's
    activation keeps what its backward needs; the fused kernel keeps nothing)."""

    def __init__(self, mlp: torch.nn.Module, key: str, activation: Activation):
        super().__init__()
        for attribute in _GATED:
            setattr(self, attribute, getattr(mlp, attribute))
        self.activation, self.table_key = activation, key
        self.train(mlp.training)

    gate_proj: torch.nn.Module
    up_proj: torch.nn.Linear
    down_proj: torch.nn.Module
    act_fn: Callable[[torch.Tensor], torch.Tensor]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up_proj
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in up.parameters())):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * up(x))
        call = linear_direct if eager_direct_allowed(x, up.weight, up.bias) else torch.ops.cutlass_tune.linear
        fused = call(x, up.weight, up.bias, self.activation.value, self.table_key, gate=self.gate_proj(x).contiguous())
        return self.down_proj(fused)

    def extra_repr(self) -> str:
        return f"activation={self.activation.value!r}, table={self.table_key!r}"


@dataclasses.dataclass(frozen=True)
class _Site:
    """A Linear followed by an activation (or gating one) in a module's structure."""

    parent: str
    linear: str
    """The Linear's attribute in `parent`."""
    then: str
    """The activation's attribute in `parent` (for a gated MLP, act_fn)."""
    activation: Activation | None
    gated: bool
    shown: str
    """What follows, in words (its type's name)."""

    def epilogue(self, linear: torch.nn.Linear) -> Epilogue:
        assert self.activation is not None  # only sites with a known activation are fused
        return Epilogue(bias=linear.bias is not None, activation=self.activation, gated=self.gated)


def _sites(model: torch.nn.Module) -> list[_Site]:
    """The fusable places the structure of `model` shows (see `_PAIRS`, `_GATED`, nn.Sequential)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Sequential):
            children = list(module._modules.items())
            for (a, first), (b, second) in zip(children, children[1:]):
                if isinstance(first, torch.nn.Linear):
                    found.append(_Site(name, a, b, activation_of_module(second), False, _shown(second)))
        elif hasattr(module, "act_fn") and all(isinstance(getattr(module, a, None), torch.nn.Linear)
                                               for a in _GATED[:3]):
            found.append(_Site(name, "up_proj", "act_fn", activation_of_module(module.act_fn), True,
                               _shown(module.act_fn)))
        else:
            for linear, then in _PAIRS:
                if isinstance(getattr(module, linear, None), torch.nn.Linear) and hasattr(module, then):
                    after = getattr(module, then)
                    found.append(_Site(name, linear, then, activation_of_module(after), False, _shown(after)))
    return [s for s in found if s.activation is not None or not isinstance(
        getattr(model.get_submodule(s.parent), s.then), (torch.nn.Dropout, torch.nn.Identity, torch.nn.Linear))]


def _shown(value: object) -> str:
    return getattr(value, "__name__", None) or type(value).__name__


def operator_takes(argument: str) -> bool:
    """Whether `torch.ops.cutlass_tune.linear` has the argument `argument` ("residual",
    "gate") in this build."""
    return any(a.name == argument for a in torch.ops.cutlass_tune.linear.default._schema.arguments)


def _qualified(parent: str, attribute: str) -> str:
    return f"{parent}.{attribute}" if parent else attribute


def patch(model: torch.nn.Module, table: BestTable | str | Path, *, cuda_only: bool = True,
          min_ratio: float = 1.0, fuse: bool = True, min_kernel_us: float = MIN_KERNEL_US) -> PatchReport:
    """Swap, in place, every torch.nn.Linear of `model` that `table` covers for a
    `cutlass_tune.nn.Linear` sharing its parameters (nothing is copied; state_dict keys stay).

    Covered (module docstring): the table has an entry of the layer's dtype, layout tn, and its
    N (out_features) and K (in_features), at any M. Left as they are, each with its reason:
    layers not on CUDA (with `cuda_only`), of another dtype than bfloat16 and float16, with
    N or K not a multiple of 8 (TMA alignment), without an entry, whose entries are slower than
    `min_ratio` of cuBLAS, subclasses of nn.Linear (their
    forward may matter: MultiheadAttention reads its out_proj's weight directly), the model
    itself, and layers swapped before. Patch the model as it will run: on its device, in its
    dtype. A module reached by two names is swapped for one module at both.

    Args:
        model: the model, changed in place.
        table: a `BestTable`, a path `BestTable.load` reads, or a key from `register_table`.
        cuda_only: leave layers that are not on CUDA. False swaps them too (they run torch's
            GEMM until the model moves to a GPU): for models built on the CPU and moved later.
        min_ratio: leave a layer whose entries all measured slower than this fraction of
            cuBLAS's speed (the table's `ratio`, cuBLAS time / kernel time, by the store's
            ranking method): at the default 1.0 a layer is swapped only where the table shows its
            tuned kernel beating cuBLAS, so patching does not make a model slower by the table's
            own figures. 0 swaps every covered layer.
        min_kernel_us: leave a layer (or a fusion) whose entries' kernels all take less than
            this many microseconds a call (the table's median time): eager code calls the tuned
            kernels through a Python path whose host time is about that, so a shorter kernel
            would leave the GPU waiting where torch's C++ call would not (benchmarks/linear_host.py).
            0 for a model run under CUDA graphs, where the host drops out.

        fuse: also fuse a Linear with the activation that follows it where the structure shows
            it: in an nn.Sequential (Linear, then nn.ReLU, nn.GELU, nn.SiLU or transformers'
            GELU/SiLU modules), in modules of transformers' MLP attribute names (BERT's
            Intermediate: dense + intermediate_act_fn; GPT-NeoX: dense_h_to_4h + act; GPT-J: fc_in +
            act), and a gated MLP's up_proj with its gate (gate_proj, up_proj, down_proj, act_fn:
            the module is replaced by a `GatedMLP` holding the same layers). Fused where the
            table has an entry of that epilogue (bias+gelu, silu+gated, ...) for the layer's N and
            K at `min_ratio` of torch or faster; the activation module becomes nn.Identity.

    Returns:
        A `PatchReport`: each layer, swapped or left, and why; fused or not, and why.

    Raises:
        MatmulInputError: `model` is no torch.nn.Module.
        BestTableError, BundleError, StoreError: a table path that cannot be read.
    """
    if not isinstance(model, torch.nn.Module):
        raise MatmulInputError(f"patch takes a torch.nn.Module, not {type(model).__name__}")
    key = table_key(table)
    tuned = registered_table(key)
    coverages: dict[int, _Coverage] = {}
    fused_from: dict[int, torch.nn.Linear] = {}  # a fused cutlass_tune.nn.Linear's id -> the layer it replaced

    def coverage_of(linear: torch.nn.Linear) -> _Coverage:
        """The table's plain entries the layer's device may use: on CUDA, those of its GPU model
        (`.frame`: all its rows there)."""
        device = linear.weight.get_device()
        if device not in coverages:
            rows = tuned if device < 0 else device_table(tuned, device, "patch")
            coverages[device] = _Coverage(rows.frame)
        return coverages[device]

    layer_coverages: dict[int, _Coverage] = {}

    def layer_coverage(linear: torch.nn.Linear) -> _Coverage:
        """The entries a plain swap of `linear` needs: plain ones, or for a layer with a bias the
        `bias` ones (module docstring)."""
        plain = coverage_of(linear)
        if linear.bias is None:
            return plain
        device = linear.weight.get_device()
        if device not in layer_coverages:
            layer_coverages[device] = _Coverage(plain.frame, Epilogue(bias=True))
        return layer_coverages[device]

    notes: dict[int, str] = {}
    fused: dict[int, tuple[str, str]] = {}
    for site in _sites(model) if fuse else []:
        parent = model.get_submodule(site.parent)
        linear = getattr(parent, site.linear)
        qualified = _qualified(site.parent, site.linear)
        why = _why_fused_not(qualified, linear, site, coverage_of, cuda_only, min_ratio, min_kernel_us)
        if why is not None:
            notes[id(linear)] = why
            continue
        epilogue = site.epilogue(linear)
        covering = _Coverage(coverage_of(linear).frame, epilogue).covering(_DTYPES[linear.weight.dtype],
                                                                            linear.out_features, linear.in_features)
        assert site.activation is not None  # _why_fused_not refuses sites without one
        if site.gated:
            holder, _, attribute = site.parent.rpartition(".")
            setattr(model.get_submodule(holder), attribute, GatedMLP(parent, key, site.activation))
            fused[id(linear)] = (epilogue.name, f"fused with gate_proj and act_fn: {covering}")
        else:
            setattr(parent, site.linear, Linear.from_linear(linear, key, activation=site.activation))
            setattr(parent, site.then, torch.nn.Identity())
            fused[id(linear)] = (epilogue.name, f"fused with {site.then}: {covering}")
            fused_from[id(getattr(parent, site.linear))] = linear

    decisions: list[LayerDecision] = []
    swaps: dict[int, Linear] = {}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if not isinstance(module, torch.nn.Linear):
            continue
        original = fused_from.get(id(module), module)
        if id(original) in fused:
            fused_name, reason = fused[id(original)]
            decisions.append(_decision(name, original, True, reason, fused_name))
            continue
        note = notes.get(id(module), "")
        if id(module) not in swaps:
            why = _why_left(name, module, layer_coverage(module), cuda_only, min_ratio, min_kernel_us)
            if why is not None and module.bias is not None \
                    and _why_left(name, module, coverage_of(module), cuda_only, min_ratio, min_kernel_us) is None:
                why += ("; its plain entries do not count for a Linear with a bias, which F.linear adds in "
                        "cuBLASLt's epilogue (tune the bias problems `cutlass-tune shapes` records)")
            if why is not None:
                decisions.append(_decision(name, module, False, why, fusion=note))
                continue
            swaps[id(module)] = Linear.from_linear(module, key, fuse_bias=module.bias is not None)
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, swaps[id(module)])
        covering = layer_coverage(module).covering(_DTYPES[module.weight.dtype], module.out_features,
                                                   module.in_features)
        decisions.append(_decision(name, module, True, covering, fusion=note))
    return PatchReport(key, tuple(decisions))


def _decision(name: str, linear: torch.nn.Linear, swapped: bool, reason: str, fused: str = "",
              fusion: str = "") -> LayerDecision:
    return LayerDecision(name, linear.in_features, linear.out_features, linear.weight.dtype, linear.weight.device,
                         swapped, reason, fused, fusion)


def _why_fused_not(name: str, linear: torch.nn.Linear, site: _Site,
                   coverage_of: Callable[[torch.nn.Linear], _Coverage], cuda_only: bool,
                   min_ratio: float, min_kernel_us: float = 0.0) -> str | None:
    """Why the Linear at `site` is not fused with what follows it; None where it is."""
    then = "gate_proj and act_fn" if site.gated else site.then
    if site.activation is None:
        return f"not fused with {then}: {site.shown}, not an activation the fused kernels compute (relu, gelu, " \
               "gelu_tanh, silu)"
    why = _why_left(name, linear, None, cuda_only, min_ratio)
    if why is None:
        epilogue = site.epilogue(linear)
        if site.gated and not operator_takes("gate"):
            why = "torch.ops.cutlass_tune.linear takes no gate argument in this build"
        else:
            why = _Coverage(coverage_of(linear).frame, epilogue).why_not(_DTYPES[linear.weight.dtype],
                                                                         linear.out_features, linear.in_features,
                                                                         min_ratio, min_kernel_us)
    return None if why is None else f"not fused with {then}: {why}"
