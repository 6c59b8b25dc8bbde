"""Render validated `KernelConfig`s to CUDA C++ source.

Templates in `templates/` only substitute values. Every token that reaches the C++ comes from a
fixed table keyed by an enum member, or is an integer checked by the space rules: a config
carrying anything else raises `RenderError` before a template is touched.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Callable, Mapping, Sequence

import jinja2

from ._files import shipped
from .errors import RenderError
from .kernel import ABI_VERSION
from .space import (
    ACTIVATIONS,
    GLU_BLOCK,
    MAX_GROUPS,
    Activation,
    Broadcast,
    DType,
    EpilogueSchedule,
    Grouping,
    Inputs,
    KernelConfig,
    KernelSchedule,
    KindRegistry,
    Layout,
    Node,
    NodeKind,
    Pair,
    Scaling,
    TileScheduler,
    check_config,
    operation_problem,
)
from .space.cutlass import BLOCKWISE_K, epilogue_tile, fused, needs_extended_wgmma

_ELEMENT = {
    DType.BF16: "cutlass::bfloat16_t",
    DType.F16: "cutlass::half_t",
    DType.F32: "float",
    DType.E4M3: "cutlass::float_e4m3_t",
    DType.E5M2: "cutlass::float_e5m2_t",
}
_LAYOUT = {Layout.ROW: "cutlass::layout::RowMajor", Layout.COL: "cutlass::layout::ColumnMajor"}
_KERNEL_SCHEDULE = {
    KernelSchedule.TMA_WS: "cutlass::gemm::KernelTmaWarpSpecialized",
    KernelSchedule.COOPERATIVE: "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
    KernelSchedule.PINGPONG: "cutlass::gemm::KernelTmaWarpSpecializedPingpong",
}
# fp8 fast accumulation is a schedule of its own (dispatch_policy.hpp). Without it, fp8 inputs
# take the plain schedules and the CollectiveBuilder picks the promoting fp8 mainloop.
_KERNEL_SCHEDULE_FP8_FAST_ACCUM = {
    KernelSchedule.TMA_WS: "cutlass::gemm::KernelTmaWarpSpecializedFP8FastAccum",
    KernelSchedule.COOPERATIVE: "cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum",
    KernelSchedule.PINGPONG: "cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum",
}
# Block-wise fp8 scaling: the mainloop multiplies each 128-deep K block's wgmma sums by A's and
# B's scales and adds them to the fp32 accumulator (sm90_mma_tma_gmma_ss_warpspecialized_fp8_
# blockwise_scaling.hpp); the rules leave these two schedules.
_KERNEL_SCHEDULE_FP8_BLOCKWISE = {
    KernelSchedule.COOPERATIVE: "cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise",
    KernelSchedule.PINGPONG: "cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise",
}
_EPILOGUE_SCHEDULE = {
    EpilogueSchedule.TMA: "cutlass::epilogue::TmaWarpSpecialized",
    EpilogueSchedule.TMA_COOPERATIVE: "cutlass::epilogue::TmaWarpSpecializedCooperative",
    EpilogueSchedule.NO_SMEM: "cutlass::epilogue::NoSmemWarpSpecialized",
}
# Grouped (ptr-array) kernels: the rules leave cooperative with tma_cooperative and ping-pong
# with tma. Both ptr-array epilogues run on two warpgroups, as the kernels assert.
_GROUPED_KERNEL_SCHEDULE = {
    KernelSchedule.COOPERATIVE: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative",
    KernelSchedule.PINGPONG: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong",
}
# fp8 grouped kernels with block-wise scales: the ptr-array FP8Blockwise mainloop reads one scale
# pointer of A and one of B per group (sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp).
_GROUPED_KERNEL_SCHEDULE_FP8_BLOCKWISE = {
    KernelSchedule.COOPERATIVE: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise",
    KernelSchedule.PINGPONG: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise",
}
_GROUPED_EPILOGUE_SCHEDULE = {
    EpilogueSchedule.TMA: "cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong",
    EpilogueSchedule.TMA_COOPERATIVE: "cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative",
    # The GLU collective's (it stores from the registers); the rules leave it to GLU kernels.
    EpilogueSchedule.NO_SMEM: "cutlass::epilogue::PtrArrayNoSmemWarpSpecialized",
}

_ACTIVATION = {activation: facets.cutlass for activation, facets in ACTIVATIONS.items()}
_FUSION = "cutlass::epilogue::fusion::"
_ROUND = "cutlass::FloatRoundStyle::round_to_nearest"


@dataclasses.dataclass(frozen=True)
class _Visitor:
    """One node of an epilogue visitor tree: its C++ type and its `Arguments` initializer."""

    type: str
    arguments: str


def _compute(fn: str, output: str, *children: _Visitor) -> _Visitor:
    """`fn` of the children's values (Sm90EVT over Sm90Compute), converted to `output`."""
    return _Visitor(
        f"{_FUSION}Sm90EVT<{_FUSION}Sm90Compute<{fn}, {output}, ElementCompute, {_ROUND}>, "
        + ", ".join(c.type for c in children) + ">",
        "{" + ", ".join(c.arguments for c in children) + ", {}}")


def _accumulator(node: Node, value: _Visitor | None, cfg: KernelConfig, output: str) -> _Visitor:
    return _Visitor(f"{_FUSION}Sm90AccFetch", "{}")


def _scaled_value(node: Node, acc: _Visitor | None, cfg: KernelConfig, output: str) -> _Visitor:
    """s * acc: alpha for 16-bit inputs; for fp8 with scales alpha * scale_a * scale_b, read on
    the device from the arguments' pointers: one fp32 each (tensor), or M values of A's rows and
    N of B's columns (rowcol)."""
    assert acc is not None
    scalar = f"{_FUSION}Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>"
    alpha = _Visitor(f"{scalar}>", "{{p->alpha}, {nullptr}, {}}")
    if node.scaling is Scaling.NONE:  # also block-wise: the mainloop scaled acc
        return _compute("cutlass::multiplies", output, alpha, acc)
    if node.scaling is Scaling.TENSOR:  # the three scalars' product, read once per tile
        scales = _Visitor(f"{scalar}, 3>",
                          "{{p->alpha, 1.0f, 1.0f}, {nullptr, static_cast<const float*>(p->scale_a), "
                          "static_cast<const float*>(p->scale_b)}, {}}")
        return _compute("cutlass::multiplies", output, scales, acc)
    # A swapped kernel's rows are B's columns and its columns A's rows (`swap_ab`).
    row_scales, col_scales = ("p->scale_b", "p->scale_a") if cfg.swap_ab else ("p->scale_a", "p->scale_b")
    # Columns: one fp32 per column of the kernel's D, staged in shared memory per tile.
    scale_b = _Visitor(f"{_FUSION}Sm90RowBroadcast<0, TileShape, float, ElementCompute, "
                       "cute::Stride<cute::_0, cute::_1, int64_t>>",
                       f"{{static_cast<const float*>({col_scales}), 0.0f, {{}}}}")
    # Rows: read straight from global memory by the threads holding them, one element at a time
    # (M need not be a multiple of 4).
    scale_a = _Visitor(f"{_FUSION}Sm90ColBroadcast<0, TileShape, float, ElementCompute, "
                       "cute::Stride<cute::_1, cute::_0, int64_t>, 1>",
                       f"{{static_cast<const float*>({row_scales}), 0.0f, {{}}}}")
    return _compute("cutlass::multiplies", output, scale_a,
                    _compute("cutlass::multiplies", "ElementCompute", scale_b,
                             _compute("cutlass::multiplies", "ElementCompute", alpha, acc)))


def _bias(node: Node, value: _Visitor | None, cfg: KernelConfig, output: str) -> _Visitor:
    """value + bias: one per column of D (a row broadcast, staged per tile), or per row of a
    swapped kernel's D (a column broadcast, read from global memory)."""
    assert value is not None
    if node.broadcast is Broadcast.ROW:
        bias = _Visitor(f"{_FUSION}Sm90ColBroadcast<0, TileShape, ElementBias, ElementCompute, "
                        "cute::Stride<cute::_1, cute::_0, int64_t>, 1>",
                        "{static_cast<const ElementBias*>(p->bias), ElementBias(0), {}}")
    else:
        bias = _Visitor(f"{_FUSION}Sm90RowBroadcast<0, TileShape, ElementBias, ElementCompute, "
                        "cute::Stride<cute::_0, cute::_1, int64_t>>",
                        "{static_cast<const ElementBias*>(p->bias), ElementBias(0), {}}")
    return _compute("cutlass::plus", output, value, bias)


_SOURCE = _Visitor(f"{_FUSION}Sm90SrcFetch<ElementC>", "{}")  # C, loaded by the TMA epilogue


def _residual(node: Node, value: _Visitor | None, cfg: KernelConfig, output: str) -> _Visitor:
    assert value is not None
    beta = _Visitor(f"{_FUSION}Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>>",
                    "{{p->beta}, {nullptr}, {}}")
    return _compute("cutlass::homogeneous_multiply_add", output, beta, _SOURCE, value)


def _activation(node: Node, value: _Visitor | None, cfg: KernelConfig, output: str) -> _Visitor:
    assert value is not None
    return _compute(_member(node, "activation", _ACTIVATION), output, value)


def _gate(node: Node, value: _Visitor | None, cfg: KernelConfig, output: str) -> _Visitor:
    assert value is not None
    act = _member(node, "activation", _ACTIVATION)
    return _compute("cutlass::multiplies", output, _compute(act, "ElementCompute", _SOURCE), value)


_Builder = Callable[[Node, "_Visitor | None", KernelConfig, str], _Visitor]
VISITORS: Mapping[NodeKind, _Builder | None] = {
    NodeKind.ACCUMULATOR: _accumulator,
    NodeKind.SCALE: _scaled_value,
    NodeKind.BIAS: _bias,
    NodeKind.RESIDUAL: _residual,
    NodeKind.ACTIVATION: _activation,
    NodeKind.GATE: _gate,
    NodeKind.GLU: None,  # a collective epilogue of its own (`_GLU`), not a visitor
    NodeKind.ROW_SCALE: None,
}
"""Each node kind's C++ visitor: built from the node, the visitor of its input and the kernel's
config, giving `output` (ElementD for the last node, which converts to D)."""

_CONVERTS = (NodeKind.ACTIVATION, NodeKind.GATE)
"""The kinds whose visitor can be the last (an Sm90Compute giving ElementD); after any other an
identity converts."""


def _tree(cfg: KernelConfig) -> _Visitor:
    """The epilogue's tree (`Epilogue.tree`) as a CUTLASS visitor tree, each node from its
    `VISITORS` builder: s * acc, + bias, then either + beta * C and the activation (D =
    activation(s * acc + beta * C + bias)) or, gated, the activation of C times it (D =
    activation(C) * (s * acc + bias))."""
    nodes = list(cfg.epilogue.tree(cfg.scaling, cfg.swap_ab).walk())
    value: _Visitor | None = None
    for i, node in enumerate(nodes):
        builder = VISITORS[node.kind]
        if builder is None:
            raise RenderError(f"{cfg.epilogue.name}: no kernel renders its {node.kind.value} node yet")
        last = i == len(nodes) - 1 and node.kind in _CONVERTS
        value = builder(node, value, cfg, "ElementD" if last else "ElementCompute")
    assert value is not None
    if nodes[-1].kind not in _CONVERTS:
        value = _compute(_ACTIVATION[Activation.NONE], "ElementD", value)
    return value


def fusion(cfg: KernelConfig) -> tuple[str, list[str]] | None:
    """The epilogue's fusion for the CollectiveBuilder (a CUTLASS fusion operation or a visitor
    tree) and the statements that fill `args.epilogue.thread` from the kernel arguments `p`;
    None for the plain linear combination (a residual alone is one: beta * C with beta from
    the arguments). The config must be valid (`check_config`). A grouped kernel's is a fusion
    operation of the ptr-array epilogue (LinCombEltAct: an activation), or with a GLU pair the
    thread operation of the GLU collective (templates/gemm_sm90_glu_epilogue.cu.j2)."""
    if not fused(cfg):
        return None
    if cfg.epilogue.pair is not Pair.NONE:  # the GLU collective's thread operation (`_glu_values`)
        act = _member(cfg.epilogue, "activation", _ACTIVATION)
        return f"cutlass_tune_glu::GluOp<ElementD, {act}>", ["args.epilogue.thread.alpha = p->alpha;"]
    # A swapped kernel's bias is one per row of its D: a column broadcast, which only the tree has.
    if cfg.scaling in (Scaling.TENSOR, Scaling.ROWCOL) or cfg.epilogue.gated or (cfg.swap_ab and cfg.epilogue.bias):
        tree = _tree(cfg)
        return tree.type, [f"args.epilogue.thread = {tree.arguments};"]
    act = _member(cfg.epilogue, "activation", _ACTIVATION)
    statements = ["args.epilogue.thread.alpha = p->alpha;", "args.epilogue.thread.beta = p->beta;"]
    if not cfg.epilogue.bias:
        return f"{_FUSION}LinCombEltAct<{act}, ElementD, ElementCompute, ElementC, ElementCompute>", statements
    statements.append("args.epilogue.thread.bias_ptr = static_cast<const ElementBias*>(p->bias);")
    return (f"{_FUSION}LinCombPerColBiasEltAct<{act}, ElementD, ElementCompute, ElementBias, ElementC, "
            "ElementCompute>", statements)


def _tile_scheduler(cfg: KernelConfig) -> str:
    if cfg.tile_scheduler is TileScheduler.STREAM_K:
        return "cutlass::gemm::StreamKScheduler"
    # The plain warp-specialized kernel is not persistent; CUTLASS wants `void` there.
    if cfg.kernel_schedule is KernelSchedule.TMA_WS:
        return "void"
    return "cutlass::gemm::PersistentScheduler"


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(shipped("templates"))),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
)


def kernel_symbol(cfg: KernelConfig) -> str:
    """C identifier prefix of a kernel's entry points (derived from the content hash)."""
    return f"ct_{cfg.hash}"


@dataclasses.dataclass(frozen=True)
class RenderedKernel:
    """C++ source of one compilation unit and the kernels it exports.

    `key` hashes the source; the compile stage adds flags and tool versions to it.
    """

    source: str
    configs: tuple[KernelConfig, ...]
    key: str

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(kernel_symbol(c) for c in self.configs)


def _int(cfg: KernelConfig, field: str) -> int:
    v = getattr(cfg, field)
    if type(v) is not int:
        raise RenderError(f"{cfg.hash}: {field} must be an int, got {type(v).__name__}")
    return v


def _member(cfg: object, field: str, table: Mapping) -> str:
    v = getattr(cfg, field)
    if not isinstance(v, enum.Enum) or v not in table:
        raise RenderError(f"{field} must be one of {[m.value for m in table]}, got {v!r}")
    return table[v]


def _bool(cfg: KernelConfig, field: str) -> bool:
    v = getattr(cfg, field)
    if type(v) is not bool:
        raise RenderError(f"{cfg.hash}: {field} must be a bool, got {type(v).__name__}")
    return v


def _plain_knobs(cfg: KernelConfig) -> dict[str, object]:
    """Every number and flag knob's field, each checked to be of its type."""
    typed = {int: _int, bool: _bool}
    return {field: typed[kind](cfg, field) for knob in cfg.knobs
            for field, kind in zip(knob.fields, knob.value_types) if kind in typed}


def _check_operation(cfg: KernelConfig) -> None:
    """Raise RenderError unless the epilogue, scaling and grouping are values of their types:
    before the config's name or hash, which read them."""
    operation = operation_problem(cfg.epilogue, cfg.scaling, cfg.grouping)
    if operation:
        raise RenderError(operation)
    _member(cfg, "grouping", {g: g.value for g in Grouping})


@dataclasses.dataclass(frozen=True)
class KindRender:
    """How one kind of operation is rendered (`RENDERERS`): its kernel template, CUTLASS's kernel
    schedules by what the mainloop multiplies (`Inputs`), its epilogue schedules, and the builder
    of its values (given the config and this entry)."""

    template: str
    kernel_schedules: Mapping[Inputs, Mapping[KernelSchedule, str]]
    epilogue_schedules: Mapping[EpilogueSchedule, str]
    values: Callable[[KernelConfig, KindRender], dict[str, object]]


RENDERERS: KindRegistry[KindRender] = KindRegistry("render builder")
"""The render builder of each kind of operation (`OperationKind`), by its grouping."""


def template_values(cfg: KernelConfig) -> dict[str, object]:
    """The values one kernel block substitutes: the number and flag knobs as they are, the
    others through fixed tables, as its kind's builder (`RENDERERS`) gives them. Raises
    RenderError for an invalid config."""
    _check_operation(cfg)
    render = RENDERERS[cfg.kind]
    return render.values(cfg, render)


def _operand_values(cfg: KernelConfig, render: KindRender, plain: Mapping[str, object],
                    kernel_schedules: Mapping[KernelSchedule, str]) -> dict[str, object]:
    """The element types, layouts and schedules, each through its fixed table. A swapped
    kernel's A is the caller's B and its B the caller's A (both K-major: tn stays tn)."""
    first, second = ("dtype_b", "dtype_a") if plain["swap_ab"] else ("dtype_a", "dtype_b")
    return {
        "element_a": _member(cfg, first, _ELEMENT),
        "element_b": _member(cfg, second, _ELEMENT),
        "element_c": _member(cfg, "dtype_c", _ELEMENT) if plain["epilogue_source"] else "void",
        "element_d": _member(cfg, "dtype_d", _ELEMENT),
        "element_acc": _member(cfg, "dtype_acc", _ELEMENT),
        "layout_a": _member(cfg, "layout_a", _LAYOUT),
        "layout_b": _member(cfg, "layout_b", _LAYOUT),
        "kernel_schedule": _member(cfg, "kernel_schedule", kernel_schedules),
        "epilogue_schedule": _member(cfg, "epilogue_schedule", render.epilogue_schedules),
    }


_GLU = {Pair.NONE: (False, 1, 1), Pair.INTERLEAVED: (True, 2, 2 * GLU_BLOCK)}
"""Per pair: whether the kernel takes the GLU collective epilogue, D's columns per N (1, or 1/2:
`pairs`), and the multiple N must be of (whole gate/up blocks). SPLIT pairs are not rendered."""


def _glu_values(cfg: KernelConfig) -> dict[str, object]:
    pair = cfg.epilogue.pair
    if not isinstance(pair, Pair) or pair not in _GLU:
        raise RenderError(f"pair must be one of {[p.value for p in _GLU]}, got {pair!r:.40}")
    glu, pairs, n_multiple = _GLU[pair]
    return {"glu": glu, "pairs": pairs, "n_multiple": n_multiple}


def _kind_values(cfg: KernelConfig, render: KindRender) -> dict[str, object]:
    """What every kind's block substitutes after the knobs."""
    return {
        **_glu_values(cfg),
        "epilogue_tile_m": epilogue_tile(cfg)[0],
        **dict(zip(("fusion", "fusion_arguments"), fusion(cfg) or ("", []))),
        "blockwise": cfg.kind.blockwise,
        "blockwise_k": BLOCKWISE_K,
        "symbol": kernel_symbol(cfg),
        "template": render.template,
    }


def _check(cfg: KernelConfig) -> None:
    rejections = check_config(cfg)
    if rejections:
        raise RenderError(f"{cfg.name}: not renderable: " + "; ".join(map(str, rejections)))


def _dense_values(cfg: KernelConfig, render: KindRender) -> dict[str, object]:
    """A single GEMM's values: its schedules (fp8 fast accumulation's where the knob asks), the
    tile scheduler (the epilogue's fusion is every kind's, `_kind_values`)."""
    plain = _plain_knobs(cfg)
    kernel_schedules = render.kernel_schedules[cfg.kind.inputs]
    if plain["fp8_fast_accum"] and kernel_schedules is _KERNEL_SCHEDULE:
        kernel_schedules = _KERNEL_SCHEDULE_FP8_FAST_ACCUM
    values = _operand_values(cfg, render, plain, kernel_schedules)
    _member(cfg, "tile_scheduler", {t: t.value for t in TileScheduler})
    _check(cfg)
    values.update(plain)
    values["tile_scheduler"] = _tile_scheduler(cfg)
    values["stream_k"] = cfg.tile_scheduler is TileScheduler.STREAM_K
    return {**values, **_kind_values(cfg, render)}


def _grouped_values(cfg: KernelConfig, render: KindRender) -> dict[str, object]:
    """A grouped kernel's values: the ptr-array schedules (the FP8Blockwise ones for block-wise
    fp8), the epilogue's fusion (an activation at most), the group scheduler (no Stream-K;
    `check_config` holds the config to that)."""
    _check(cfg)
    plain = _plain_knobs(cfg)
    values = _operand_values(cfg, render, plain, render.kernel_schedules.get(cfg.kind.inputs, {}))
    return {**values, **plain, "max_groups": MAX_GROUPS, "grouped_k": cfg.grouping is Grouping.GROUPED_K,
            **_kind_values(cfg, render)}


RENDERERS.add(KindRender("gemm_sm90_kernel.cu.j2", {
    Inputs.WIDE: _KERNEL_SCHEDULE, Inputs.FP8: _KERNEL_SCHEDULE, Inputs.FP8_BLOCKWISE: _KERNEL_SCHEDULE_FP8_BLOCKWISE,
}, _EPILOGUE_SCHEDULE, _dense_values), grouping=Grouping.NONE)
RENDERERS.add(KindRender("gemm_sm90_grouped_kernel.cu.j2", {
    Inputs.WIDE: _GROUPED_KERNEL_SCHEDULE, Inputs.FP8_BLOCKWISE: _GROUPED_KERNEL_SCHEDULE_FP8_BLOCKWISE,
}, _GROUPED_EPILOGUE_SCHEDULE, _grouped_values), grouping=Grouping.GROUPED)
# The weight gradient (dW_e = G_e^T X_e): the same ptr-array kernel over an M-major A and an
# N-major B, its builder giving each group its rows as K (the template's `grouped_k` block).
RENDERERS.add(KindRender("gemm_sm90_grouped_kernel.cu.j2", {Inputs.WIDE: _GROUPED_KERNEL_SCHEDULE},
                         _GROUPED_EPILOGUE_SCHEDULE, _grouped_values), grouping=Grouping.GROUPED_K)


def render_unit(configs: Sequence[KernelConfig]) -> RenderedKernel:
    """Render one translation unit holding every config in `configs` (distinct, valid).

    Raises:
        RenderError: a config is invalid, carries a value outside its enum or is repeated.
    """
    if not configs:
        raise RenderError("nothing to render")
    for c in configs:
        _check_operation(c)
    if len({c.hash for c in configs}) != len(configs):
        raise RenderError("a unit cannot hold the same kernel twice")
    kernels = [template_values(c) for c in configs]
    source = _env.get_template("gemm_sm90_unit.cu.j2").render(
        kernels=kernels, abi_version=ABI_VERSION,
        # Only where a tile needs them: for the other tiles the builder picks the same wgmma
        # either way, and their units stay on CUTLASS's default path.
        extended_wgmma=any(needs_extended_wgmma(c) for c in configs),
        fused=any(fused(c) for c in configs),
        grouped=any(c.kind.grouped for c in configs),
        blockwise=any(c.kind.blockwise for c in configs),
        glu=any(c.epilogue.pair is not Pair.NONE for c in configs),
    )
    key = hashlib.sha256(source.encode()).hexdigest()
    return RenderedKernel(source=source, configs=tuple(configs), key=key)
