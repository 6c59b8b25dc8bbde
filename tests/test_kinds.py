import pytest

from cutlass_tune import render
from cutlass_tune.measurement import BASELINES, KIND_CONTENDERS, Baseline
from cutlass_tune.search._prior_strategy import FAMILIES
from cutlass_tune.search._seeds import DEFAULT_KNOBS
from cutlass_tune.space import DType, Grouping, Inputs, KindRegistry, Operation, OperationKind, Scaling

FP8 = {"dtype_a": DType.E4M3, "dtype_b": DType.E4M3}
KINDS = {  # one operation of each kind a kernel is built for
    OperationKind(): Operation(),
    OperationKind(inputs=Inputs.FP8): Operation(**FP8, scaling=Scaling.ROWCOL),
    OperationKind(inputs=Inputs.FP8_BLOCKWISE): Operation(**FP8, scaling=Scaling.BLOCKWISE),
    OperationKind(Grouping.GROUPED): Operation(grouping=Grouping.GROUPED),
    OperationKind(Grouping.GROUPED, Inputs.FP8_BLOCKWISE): Operation(**FP8, scaling=Scaling.BLOCKWISE,
                                                                     grouping=Grouping.GROUPED),
}


def test_an_operation_knows_its_kind():
    for kind, operation in KINDS.items():
        assert operation.kind == kind
    assert Operation(**FP8).kind.inputs is Inputs.FP8  # unscaled fp8: the epilogue's kind
    assert Operation(**FP8, scaling=Scaling.BLOCKWISE, grouping=Grouping.GROUPED).kind.name == "grouped fp8-blockwise"


def test_the_most_specific_entry_wins():
    stage: KindRegistry[str] = KindRegistry("test stage")
    stage.add("default")
    stage.add("grouped", grouping=Grouping.GROUPED)
    stage.add("blockwise", inputs=Inputs.FP8_BLOCKWISE)
    stage.add("grouped blockwise", grouping=Grouping.GROUPED, inputs=Inputs.FP8_BLOCKWISE)
    assert stage[OperationKind()] == "default"
    assert stage[OperationKind(Grouping.GROUPED)] == "grouped"
    assert stage[OperationKind(inputs=Inputs.FP8_BLOCKWISE)] == "blockwise"
    assert stage[OperationKind(Grouping.GROUPED, Inputs.FP8_BLOCKWISE)] == "grouped blockwise"


def test_a_kind_without_an_entry_is_named():
    stage: KindRegistry[str] = KindRegistry("test stage")
    stage.add("grouped", grouping=Grouping.GROUPED)
    assert OperationKind() not in stage
    with pytest.raises(LookupError, match="no test stage for dense 16-bit operations"):
        stage[OperationKind()]
    with pytest.raises(ValueError, match="registered already"):
        stage.add("again", grouping=Grouping.GROUPED)


@pytest.mark.parametrize("registry", [render.RENDERERS, BASELINES, KIND_CONTENDERS, FAMILIES, DEFAULT_KNOBS],
                         ids=lambda r: r.stage)
def test_every_stage_has_an_entry_for_every_kind(registry):
    assert all(kind in registry for kind in KINDS)


def test_the_kinds_take_their_stages_entries():
    """The entries that replaced the stages' branches on grouping and block-wise scaling."""
    assert {k: render.RENDERERS[k].template for k in KINDS} == {
        k: "gemm_sm90_grouped_kernel.cu.j2" if k.grouped else "gemm_sm90_kernel.cu.j2" for k in KINDS}
    assert [Baseline.of(op) for op in KINDS.values()] == [
        Baseline.CUBLAS, Baseline.EAGER, Baseline.EAGER, Baseline.GROUPED_MM, Baseline.GROUPED_MM]
    assert Baseline.of(Operation(**FP8)) is Baseline.CUBLAS  # a plain fp8 GEMM: cuBLAS's
    assert [FAMILIES[k].name for k in KINDS] == ["plain", "fp8", "fp8", "grouped", "grouped"]
