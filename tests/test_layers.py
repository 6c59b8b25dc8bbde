"""The pipeline's stages import downward only (read from the source by tests/layers.py)."""

import graphlib

import pytest

from tests.layers import TOP, read_graph

ORDER = ("errors", "status", "regime", "_files", "_devices", "space", "settings", "kernel", "_torch", "capture",
         "render", "measurement", "compile", "tables", "store", "search", "report", "runtime", "nn", "transformers",
         "bench", TOP, "cli")
"""The stages from the ground up: each imports, at module level, only stages before it."""

LAZY = {
    ("runtime", "compile"): "a kernel no bundle holds is compiled on first use; a host serving bundles has no compiler",
    ("runtime", "report"): "a store URL is read by the tuner's report stage; a serving host never takes that path",
    ("cli", "bench"): "torch, for the commands that measure",
    ("cli", "search"): "Optuna, for the commands that search",
    ("cli", "capture"): "torch, for `shapes`, which runs a model to record its GEMMs",
    (TOP, "report"): "`import cutlass_tune` stays light: the table and matmul load on first use",
    (TOP, "runtime"): "the same",
    (TOP, "nn"): "the same (torch, for models)",
    ("bench", "transformers"): "the experts of transformers models need transformers; other models never import it",
}
"""The only imports of one stage by another inside a function, and why each is deferred."""

BENCH_ON_RUNTIME = {
    "bench._check": "`cutlass-tune check` times the runtime's `matmul` as a caller gets it, at the call site",
    "bench._in_model": "`cutlass-tune tune-model` runs the model's own step through the runtime's doors",
}
"""The only bench modules that import the runtime, and why: the rest load kernels through `kernel`."""

GRAPH = read_graph()


def test_every_stage_has_its_place():
    assert set(GRAPH.lines) == set(ORDER)


def test_no_circle_between_stages():
    try:
        GRAPH.floors()
    except graphlib.CycleError as err:
        pytest.fail(f"stages import each other: {err.args[1]}")


@pytest.mark.parametrize("stage", ORDER)
def test_a_stage_imports_only_stages_below_it(stage):
    below = set(ORDER[: ORDER.index(stage)])
    assert GRAPH.eager.get(stage, set()) <= below, f"{stage} imports {GRAPH.eager[stage] - below} from above"


def test_imports_inside_functions_are_the_listed_ones():
    deferred = {(stage, other) for stage, others in GRAPH.lazy.items() for other in others
                if other not in GRAPH.eager.get(stage, set())}
    assert deferred == set(LAZY)


def test_the_tuner_never_imports_the_gpu_stage():
    # Regression: store, search and report imported `Measurement` from bench, and with it torch.
    for stage in ("store", "search", "report", "tables", "runtime"):
        assert "bench" not in GRAPH.eager.get(stage, set()) | GRAPH.lazy.get(stage, set()), stage


def test_bench_loads_kernels_below_the_runtime():
    # Regression: the GPU worker loaded kernels through the runtime, which imported the compiler.
    importers = {module for module, imported in GRAPH.modules.items()
                 if module.split(".")[0] == "bench" and any(m.split(".")[0] == "runtime" for m in imported)}
    assert importers == set(BENCH_ON_RUNTIME)
