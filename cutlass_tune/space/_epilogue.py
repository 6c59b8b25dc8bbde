"""The fused epilogue, declared once: `Epilogue` (the public value), its tree of nodes, and one
table of facets per activation and per node kind.

`Epilogue` is what a GEMM's last pass computes from the accumulator, written in names and stores
as before ("bias+silu", "silu+gated"). Every stage reads its meaning from here rather than
writing it again:

- `ACTIVATIONS`: one entry per `Activation`: its CUTLASS functor (render), its torch function
  as a name of `torch.nn.functional` with keyword arguments (`_torch.ACTIVATION` is built from
  it), its aten backward (`_torch.ACTIVATION_GRAD`), the aten ops, modules and functions that
  compute it (the recognisers of capture, patch and the Inductor pass), and whether cuBLASLt's
  epilogue computes it (`measurement.LT_ACTIVATIONS`). A new activation is its enum member and
  its entry here.
- `Epilogue.tree`: the epilogue as a chain of `Node`s from the accumulator to D (scales, bias by
  column or by row, C as residual, activation, gate; declared for the MoE layer: the GLU pair
  that halves N and the per-row scale), and `NODES`: per node kind, the operands it adds (their
  shapes at a GEMM's M and N), what it makes of D's shape, and the kernels that render it. The
  C++ visitor of each kind is render.py's `VISITORS`, its torch meaning (fp32 reference
  and fallback) and gradient `_torch.NODE_TORCH`; tests check that each covers every kind.

Torch-free: the tables hold names, and the torch side resolves them.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterator, Mapping

from ._types import Grouping, Scaling


class Activation(str, enum.Enum):
    """Element-wise function applied in a fused epilogue (`ACTIVATIONS` holds what each is).
    GELU is the erf form (`F.gelu`), GELU_TANH its tanh approximation (`F.gelu(approximate="tanh")`)."""

    NONE = "none"
    RELU = "relu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"


Kwargs = tuple[tuple[str, object], ...]
"""Keyword arguments as a hashable tuple of (name, value) pairs."""


@dataclasses.dataclass(frozen=True)
class ActivationFacets:
    """What an activation is to every stage.

    Attributes:
        cutlass: the CUTLASS functor template (render's visitor and fusion operations).
        torch: the function of `torch.nn.functional` that computes it, called with `kwargs`.
        kwargs: its keyword arguments, also the attributes a module recognised as it must have
            (nn.GELU's `approximate`) and the ones an aten op of `aten` must be given.
        backward: the aten op that computes its gradient as `backward(grad, z, *backward_args,
            **backward_kwargs)`, z its input.
        aten: the aten ops (their names without overload; an in-place "_" form is the same) that
            compute it on their first argument: what capture and the Inductor pass read back.
        modules: the class names of the modules computing it (torch.nn's and transformers'); a
            module with `inplace` true is never one.
        functions: the functions computing it, as dotted names (`torch.relu`).
        cublaslt: whether cuBLASLt's epilogue (`torch._addmm_activation`) computes it as torch
            defines it.
    """

    cutlass: str
    torch: str
    kwargs: Kwargs = ()
    backward: str = ""
    backward_args: tuple[object, ...] = ()
    backward_kwargs: Kwargs = ()
    aten: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    cublaslt: bool = False


ACTIVATIONS: Mapping[Activation, ActivationFacets] = {
    Activation.NONE: ActivationFacets(cutlass="cutlass::epilogue::thread::Identity", torch=""),
    Activation.RELU: ActivationFacets(
        cutlass="cutlass::epilogue::thread::ReLu", torch="relu",
        backward="threshold_backward", backward_args=(0,), aten=("relu",), modules=("ReLU",),
        functions=("torch.nn.functional.relu", "torch.relu"), cublaslt=True),
    Activation.GELU: ActivationFacets(
        cutlass="cutlass::epilogue::thread::GELU", torch="gelu", kwargs=(("approximate", "none"),),
        backward="gelu_backward", backward_kwargs=(("approximate", "none"),), aten=("gelu",),
        modules=("GELU", "GELUActivation"), functions=("torch.nn.functional.gelu",)),
    Activation.GELU_TANH: ActivationFacets(
        # 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
        cutlass="cutlass::epilogue::thread::GELU_taylor", torch="gelu", kwargs=(("approximate", "tanh"),),
        backward="gelu_backward", backward_kwargs=(("approximate", "tanh"),), aten=("gelu",),
        modules=("GELU", "GELUTanh", "PytorchGELUTanh", "NewGELUActivation", "FastGELUActivation",
                 "GELUPytorchTanh"),
        cublaslt=True),
    Activation.SILU: ActivationFacets(
        cutlass="cutlass::epilogue::thread::SiLu", torch="silu", backward="silu_backward", aten=("silu",),
        modules=("SiLU", "SiLUActivation"), functions=("torch.nn.functional.silu",)),
}
"""Every activation's facets (`ActivationFacets`); NONE is the identity."""


def activation_of_aten(op: str, kwargs: Mapping[str, object]) -> Activation | None:
    """The activation the aten op named `op` ("relu", "gelu_", ...; in place or not) computes
    on its first argument given its keyword arguments `kwargs` (those it was not given take the
    entry's values); None for any other op."""
    name = op.removesuffix("_")
    for activation, facets in ACTIVATIONS.items():
        if name in facets.aten and all(kwargs.get(k, v) == v for k, v in facets.kwargs):
            return activation
    return None


def activation_of_module_class(names: tuple[str, ...],
                               attributes: Callable[[str, object], object]) -> Activation | None:
    """The activation a module computes: the first entry naming one of `names` (the module's
    class and its bases, most derived first) whose `kwargs` the module holds as attributes
    (`attributes(name, default)` reads one); None where none does."""
    for name in names:
        for activation, facets in ACTIVATIONS.items():
            if name in facets.modules and all(attributes(k, v) == v for k, v in facets.kwargs):
                return activation
    return None


class NodeKind(str, enum.Enum):
    """The kinds of node of an epilogue's tree (`NODES` holds what each is)."""

    ACCUMULATOR = "accumulator"
    """acc = A @ B in fp32 (block-wise fp8 scales are the mainloop's, already in it)."""
    SCALE = "scale"
    """s * value: alpha, or fp8 scales (one per tensor, or per row of A times per column of B)."""
    BIAS = "bias"
    """value + bias: one per column of D (nn.Linear's), or per row (an A/B-swapped kernel's)."""
    RESIDUAL = "residual"
    """value + beta * C, C an M x N operand of D's type."""
    ACTIVATION = "activation"
    """activation(value)."""
    GATE = "gate"
    """activation(C) * value, C the gate's pre-activation (M x N, D's type)."""
    GLU = "glu"
    """The gated pair in one GEMM: D = activation(gate columns) * up columns of the value, so D
    has half its N (`Pair`). Rendered for grouped kernels with interleaved pairs (a collective
    epilogue of its own: templates/gemm_sm90_glu_epilogue.cu.j2)."""
    ROW_SCALE = "row_scale"
    """value * r, one fp32 r per row of D (MoE routing weights). Declared, not rendered yet."""


class Broadcast(str, enum.Enum):
    """How a bias vector spreads over D."""

    COLUMN = "column"  # one per column (length N), as nn.Linear's
    ROW = "row"  # one per row of the kernel's D: a swapped kernel's, whose rows are the caller's columns


class Pair(str, enum.Enum):
    """How a GLU pair's gate and up columns lie in the GEMM's N (`NodeKind.GLU`)."""

    NONE = "none"
    INTERLEAVED = "glu"  # blocks of GLU_BLOCK gate columns, then GLU_BLOCK up columns, and so on
    SPLIT = "glu-split"  # the gate's N/2 columns, then the up's N/2 (transformers' gate_up_proj)


GLU_BLOCK = 8
"""An interleaved GLU pair's block of columns (CUTLASS 4.6's example 113 interleaves gate and up
rows of the weight in blocks of 8, so that one thread's fragment holds both)."""


class Role(str, enum.Enum):
    """An operand's element type, relative to the problem."""

    D = "d"  # D's type
    F32 = "f32"


@dataclasses.dataclass(frozen=True)
class Operand:
    """An extra input an epilogue reads: its name (the argument and `Operands` field it is
    passed as), its shape and its element type."""

    name: str
    shape: tuple[int, ...]
    role: Role


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of an epilogue's tree: its kind and the node whose value it takes (None for the
    accumulator), with what its kind reads of the rest (the activation of ACTIVATION, GATE and
    GLU; the scaling of SCALE; the broadcast of BIAS; the pair of GLU)."""

    kind: NodeKind
    input: Node | None = None
    activation: Activation = Activation.NONE
    scaling: Scaling = Scaling.NONE
    broadcast: Broadcast = Broadcast.COLUMN
    pair: Pair = Pair.NONE

    def walk(self) -> Iterator[Node]:
        """The nodes from the accumulator up to this one."""
        if self.input is not None:
            yield from self.input.walk()
        yield self

    @property
    def kinds(self) -> tuple[NodeKind, ...]:
        return tuple(node.kind for node in self.walk())


def _no_operands(node: Node, m: int, n: int) -> tuple[Operand, ...]:
    return ()


def _same_shape(m: int, n: int) -> tuple[int, int]:
    return m, n


def _halved(m: int, n: int) -> tuple[int, int]:
    if n % (2 * GLU_BLOCK):
        raise ValueError(f"a GLU pair needs N a multiple of {2 * GLU_BLOCK} (gate and up blocks of {GLU_BLOCK}), "
                         f"not {n}")
    return m, n // 2


def _scale_operands(node: Node, m: int, n: int) -> tuple[Operand, ...]:
    if node.scaling is Scaling.TENSOR:
        return Operand("scale_a", (), Role.F32), Operand("scale_b", (), Role.F32)
    if node.scaling is Scaling.ROWCOL:
        return Operand("scale_a", (m, 1), Role.F32), Operand("scale_b", (1, n), Role.F32)
    return ()


@dataclasses.dataclass(frozen=True)
class NodeFacets:
    """What a node kind is, torch-free.

    Attributes:
        operands: the operands a node adds, at the GEMM's M and N (D's shape before this node).
        output: D's shape after the node, from the shape before it.
        rendered: the groupings whose kernels render it (render.py's `VISITORS` builds its visitor).
    """

    operands: Callable[[Node, int, int], tuple[Operand, ...]]
    output: Callable[[int, int], tuple[int, int]] = _same_shape
    rendered: frozenset[Grouping] = frozenset({Grouping.NONE})


NODES: Mapping[NodeKind, NodeFacets] = {
    NodeKind.ACCUMULATOR: NodeFacets(_no_operands, rendered=frozenset(Grouping)),
    NodeKind.SCALE: NodeFacets(_scale_operands, rendered=frozenset(Grouping)),
    NodeKind.BIAS: NodeFacets(lambda node, m, n: (Operand("bias", (n,) if node.broadcast is Broadcast.COLUMN
                                                          else (m,), Role.D),)),
    NodeKind.RESIDUAL: NodeFacets(lambda node, m, n: (Operand("c", (m, n), Role.D),)),
    NodeKind.ACTIVATION: NodeFacets(_no_operands, rendered=frozenset(Grouping)),
    NodeKind.GATE: NodeFacets(lambda node, m, n: (Operand("c", (m, n), Role.D),)),
    NodeKind.GLU: NodeFacets(_no_operands, output=_halved, rendered=frozenset({Grouping.GROUPED})),
    NodeKind.ROW_SCALE: NodeFacets(lambda node, m, n: (Operand("row_scale", (m,), Role.F32),), rendered=frozenset()),
}
"""Every node kind's facets (`NodeFacets`)."""


_EPILOGUE_SCALES = (Scaling.TENSOR, Scaling.ROWCOL)
"""The scalings the epilogue applies; block-wise scales are the mainloop's."""


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What the GEMM's last pass computes from the accumulator: part of the user's op, not a
    tuning knob. With every field set: D = activation(s * (A @ B) + beta * C + bias), where s
    is alpha (or the fp8 scales, see `Scaling`), bias is one value per output column (length N,
    as `nn.Linear`) and C an M x N operand of D's type (a residual).

    `gated` reads C otherwise: C holds a gate's pre-activation and D = activation(C) * (s *
    (A @ B) + bias), the up projection of a gated MLP (`silu(x Wg^T) * (x Wu^T)`, C = x Wg^T),
    so the gate's activation and the product need no pass of their own. It excludes `residual`
    (both are C).

    For the MoE layer: `pair`, the gate and up projections in one GEMM of 2N' columns, D =
    activation(gate columns) * up columns (M x N'), rendered for grouped kernels with interleaved
    pairs (`NODES`); `row_scale`, D's rows each times one fp32 value (routing weights), applied
    last (declared, not rendered yet).

    Written in files and stores as `name`: "none", or its parts joined by "+" in the order
    bias, activation, residual or gated or the pair ("glu", "glu-split"), "row-scale" (e.g.
    "bias+silu", "residual", "silu+gated", "silu+glu").
    """

    bias: bool = False
    activation: Activation = Activation.NONE
    residual: bool = False
    gated: bool = False
    pair: Pair = Pair.NONE
    row_scale: bool = False

    @property
    def is_plain(self) -> bool:
        return self == Epilogue()

    @property
    def name(self) -> str:
        parts = (["bias"] if self.bias else []) + (
            [self.activation.value] if self.activation is not Activation.NONE else []) + (
            ["residual"] if self.residual else []) + (["gated"] if self.gated else []) + (
            [self.pair.value] if self.pair is not Pair.NONE else []) + (["row-scale"] if self.row_scale else [])
        return "+".join(parts) or "none"

    @classmethod
    def parse(cls, text: str) -> Epilogue:
        """Inverse of `name`. Raises ValueError naming the part it does not know."""
        if text == "none":
            return cls()
        flags = {"bias": False, "residual": False, "gated": False, "row-scale": False}
        activation, pair = Activation.NONE, Pair.NONE
        activations = [a.value for a in Activation if a is not Activation.NONE]
        pairs = [p.value for p in Pair if p is not Pair.NONE]
        for part in text.split("+"):
            if flags.get(part) is False:
                flags[part] = True
            elif part in activations and activation is Activation.NONE:
                activation = Activation(part)
            elif part in pairs and pair is Pair.NONE:
                pair = Pair(part)
            else:
                known = ", ".join(["bias", *activations, "residual", "gated", *pairs, "row-scale"])
                raise ValueError(f"epilogue {text[:60]!r}: unknown or repeated part {part[:30]!r} "
                                 f"(parts: {known}, joined by '+', or 'none')")
        found = cls(flags["bias"], activation, flags["residual"], flags["gated"], pair, flags["row-scale"])
        why = found.problem()
        if why:
            raise ValueError(f"epilogue {text[:60]!r}: {why}")
        if found.name != text:
            raise ValueError(f"epilogue {text[:60]!r}: write it as {found.name!r}")
        return found

    def problem(self) -> str | None:
        """Why these fields make no epilogue, or None: two nodes reading C, or a pair with C."""
        if self.residual and self.gated:
            return "residual and gated both read C; take one"
        if self.pair is not Pair.NONE and (self.residual or self.gated):
            return "a GLU pair takes its gate from the GEMM's own columns: no residual or gated"
        return None

    def tree(self, scaling: Scaling = Scaling.NONE, swap_ab: bool = False) -> Node:
        """The epilogue as a chain of nodes, the accumulator first and D last, for a kernel of
        `scaling` (its SCALE node) and, `swap_ab`, whose D is the caller's transposed (its bias is
        by row). Built once per value (the runtime asks on its hot path)."""
        return _tree(self, scaling, swap_ab)

    def _build_tree(self, scaling: Scaling, swap_ab: bool) -> Node:
        node = Node(NodeKind.SCALE, Node(NodeKind.ACCUMULATOR),
                    scaling=scaling if scaling in _EPILOGUE_SCALES else Scaling.NONE)
        if self.bias:
            node = Node(NodeKind.BIAS, node, broadcast=Broadcast.ROW if swap_ab else Broadcast.COLUMN)
        if self.gated:
            node = Node(NodeKind.GATE, node, activation=self.activation)
        elif self.pair is not Pair.NONE:
            node = Node(NodeKind.GLU, node, activation=self.activation, pair=self.pair)
        else:
            if self.residual:
                node = Node(NodeKind.RESIDUAL, node)
            if self.activation is not Activation.NONE:
                node = Node(NodeKind.ACTIVATION, node, activation=self.activation)
        if self.row_scale:
            node = Node(NodeKind.ROW_SCALE, node)
        return node

    def output_shape(self, m: int, n: int) -> tuple[int, int]:
        """D's shape for a GEMM of M x N: M x N, or M x N/2 with a GLU pair. Raises ValueError
        for an N the pair cannot halve."""
        if self.pair is Pair.NONE:  # no node changes the shape: the runtime's hot path asks
            return m, n
        shape = (m, n)
        for node in self.tree().walk():
            shape = NODES[node.kind].output(*shape)
        return shape

    def operands(self, m: int, n: int) -> tuple[Operand, ...]:
        """The operands the epilogue reads besides A and B (fp8 scales are the scaling's: see
        `Node.walk` of `tree(scaling)`), each once, at a GEMM of M x N."""
        return tree_operands(self.tree(), m, n)


@functools.lru_cache(maxsize=256)
def _tree(epilogue: Epilogue, scaling: Scaling, swap_ab: bool) -> Node:
    return epilogue._build_tree(scaling, swap_ab)


def tree_operands(tree: Node, m: int, n: int) -> tuple[Operand, ...]:
    """Every operand the nodes of `tree` read, each once, in the order of the tree, at a GEMM of
    M x N (a node's shapes are D's before it)."""
    found: dict[str, Operand] = {}
    shape = (m, n)
    for node in tree.walk():
        facets = NODES[node.kind]
        for operand in facets.operands(node, *shape):
            found.setdefault(operand.name, operand)
        shape = facets.output(*shape)
    return tuple(found.values())


def unrendered(tree: Node, grouping: Grouping) -> tuple[NodeKind, ...]:
    """The kinds of node of `tree` that no kernel of `grouping` renders."""
    return tuple(dict.fromkeys(node.kind for node in tree.walk() if grouping not in NODES[node.kind].rendered))
