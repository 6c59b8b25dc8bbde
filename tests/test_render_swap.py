"""The A/B swap (`swap_ab`) of fp8 row-wise kernels in the rendered source: the kernel's
arguments swap the operands, the problem's M and N and the scales, and write D column-major;
the caller's arguments (the ABI struct) are the unswapped kernel's."""

import dataclasses

import pytest

from cutlass_tune import render
from cutlass_tune.errors import RenderError
from cutlass_tune.render import render_unit
from cutlass_tune.space import DType, Epilogue, EpilogueSchedule, KernelConfig, KernelSchedule, Scaling

ROWCOL = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_m=64, tile_n=16, tile_k=256, fp8_fast_accum=True,
                      scaling=Scaling.ROWCOL, kernel_schedule=KernelSchedule.PINGPONG,
                      epilogue_schedule=EpilogueSchedule.TMA, epilogue_source=False)
SWAPPED = dataclasses.replace(ROWCOL, swap_ab=True)


def _arguments(cfg: KernelConfig) -> str:
    """The kernel's `make_arguments` body."""
    source = render_unit([cfg]).source
    start = source.index("static typename Gemm::Arguments make_arguments")
    return source[start:source.index("return args;", start)]


def test_swapped_kernel_passes_b_as_a_and_a_as_b_over_the_transposed_problem():
    body = _arguments(SWAPPED)
    assert "{n, m, k, 1}" in body and "{m, n, k, 1}" not in body
    stride = "cutlass::make_cute_packed_stride"
    assert f"static_cast<const ElementA*>(p->b), {stride}(StrideA{{}}, make_shape(n, k, 1))" in body
    assert f"static_cast<const ElementB*>(p->a), {stride}(StrideB{{}}, make_shape(m, k, 1))" in body
    assert f"static_cast<ElementD*>(p->d), {stride}(StrideD{{}}, make_shape(n, m, 1))" in body
    plain = _arguments(ROWCOL)
    assert "{m, n, k, 1}" in plain and "static_cast<const ElementA*>(p->a)" in plain


def test_swapped_kernel_writes_d_column_major():
    source = render_unit([SWAPPED]).source
    assert "using LayoutD = cutlass::layout::ColumnMajor;" in source
    assert "using LayoutC = cutlass::layout::ColumnMajor;" in source
    # the operands stay K-major: the caller's B (N x K) is row-major, its A (M x K) column-major K x M
    assert "using LayoutA = cutlass::layout::RowMajor;" in source
    assert "using LayoutB = cutlass::layout::ColumnMajor;" in source
    assert "using LayoutD = cutlass::layout::RowMajor;" in render_unit([ROWCOL]).source


def test_swapped_kernel_reads_a_scales_per_column_and_b_scales_per_row():
    values = render.template_values(SWAPPED)
    (statement,) = values["fusion_arguments"]
    col = "Sm90ColBroadcast<0, TileShape, float"
    row = "Sm90RowBroadcast<0, TileShape, float"
    tree = values["fusion"]
    # The tree's row broadcast comes after its column broadcast, and the arguments in the same order.
    assert tree.index(col) < tree.index(row)
    assert statement.index("p->scale_b") < statement.index("p->scale_a")
    plain = render.template_values(ROWCOL)["fusion_arguments"][0]
    assert plain.index("p->scale_a") < plain.index("p->scale_b")


def test_swapped_bias_is_a_column_broadcast():
    cfg = dataclasses.replace(SWAPPED, epilogue=Epilogue.parse("bias+silu"))
    tree = render.template_values(cfg)["fusion"]
    assert "Sm90ColBroadcast<0, TileShape, ElementBias, ElementCompute, cute::Stride<cute::_1, cute::_0, int64_t>, 1>" \
        in tree
    assert "Sm90RowBroadcast<0, TileShape, ElementBias" not in tree


def test_swapped_mixed_fp8_kernel_swaps_the_element_types():
    cfg = dataclasses.replace(SWAPPED, dtype_b=DType.E5M2)
    values = render.template_values(cfg)
    assert (values["element_a"], values["element_b"]) == ("cutlass::float_e5m2_t", "cutlass::float_e4m3_t")


@pytest.mark.parametrize("change", [
    dict(scaling=Scaling.TENSOR),
    dict(epilogue=Epilogue.parse("bias+residual"), epilogue_source=True),
    dict(dtype_a=DType.BF16, dtype_b=DType.BF16, scaling=Scaling.NONE, fp8_fast_accum=False, tile_k=64),
])
def test_swap_outside_fp8_rowcol_is_not_rendered(change):
    with pytest.raises(RenderError, match="swap_ab"):
        render_unit([dataclasses.replace(SWAPPED, **change)])


BLOCKWISE = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_m=64, tile_n=32, tile_k=128, scale_n=64,
                         scaling=Scaling.BLOCKWISE, swap_ab=True, kernel_schedule=KernelSchedule.PINGPONG,
                         epilogue_schedule=EpilogueSchedule.TMA, epilogue_source=False)


def test_swapped_blockwise_kernel_reads_the_weights_scales_as_its_a_scales():
    body = _arguments(BLOCKWISE)
    assert "{n, m, k, 1}" in body
    # The caller's B scales (the weights', K-major) are the swapped mainloop's SFA, its A scales SFB,
    # both laid over the swapped problem.
    sfa = "static_cast<const float*>(p->scale_b), ScaleConfig::tile_atom_to_shape_SFA(make_shape(n, m, k, 1))"
    sfb = "static_cast<const float*>(p->scale_a), ScaleConfig::tile_atom_to_shape_SFB(make_shape(n, m, k, 1))"
    assert body.index("static_cast<const ElementB*>(p->a)") < body.index(sfa) < body.index(sfb)
    assert "{p->alpha, p->beta}" in body  # the plain epilogue: the mainloop applied the scales
    source = render_unit([BLOCKWISE]).source
    assert "Sm90BlockwiseScaleConfig<64, 1, 128,\n    cute::GMMA::Major::K, cute::GMMA::Major::MN>" in source
    unswapped = render_unit([dataclasses.replace(BLOCKWISE, swap_ab=False, tile_n=64)]).source
    assert "Sm90BlockwiseScaleConfig<1, 64, 128,\n    cute::GMMA::Major::MN, cute::GMMA::Major::K>" in unswapped
    assert "tile_atom_to_shape_SFA(make_shape(m, n, k, 1))" in unswapped


def test_swapped_blockwise_bias_is_a_column_broadcast():
    """Guards against the 16-bit per-column bias fusion, which would add N's bias along M."""
    tree = render.template_values(dataclasses.replace(BLOCKWISE, epilogue=Epilogue.parse("bias+silu")))["fusion"]
    assert "Sm90ColBroadcast<0, TileShape, ElementBias" in tree and "LinCombPerColBiasEltAct" not in tree
    unswapped = dataclasses.replace(BLOCKWISE, swap_ab=False, tile_n=64, epilogue=Epilogue.parse("bias+silu"))
    assert "LinCombPerColBiasEltAct" in render.template_values(unswapped)["fusion"]
