"""In-model tuning's decisions on recorded events, without a GPU (search/_in_model.py)."""

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune.runtime import BestTable
from cutlass_tune.search._in_model import (
    HELD,
    RANGE_PREFIX,
    STEP_PREFIX,
    TORCH,
    Candidate,
    Covered,
    GainSplit,
    InModelError,
    StepSplit,
    call_counts,
    choose,
    covered,
    duty_cycle,
    is_gemm_kernel,
    kernel_spans,
    kernel_times,
    schedule,
    step_frame,
    step_split,
    tuned_frame,
)
from cutlass_tune.space import DType, Layout, Problem
from cutlass_tune.tables import read_table

TABLE = Path(__file__).resolve().parents[1] / "report" / "data" / "best-v2.csv"


@pytest.fixture
def frame():
    return read_table(TABLE)


def problem_of(row) -> Problem:
    return Problem(int(row["m"]), int(row["n"]), int(row["k"]), dtype_a=DType.BF16, dtype_b=DType.BF16,
                   dtype_d=DType.BF16, layout_a=Layout.ROW, layout_b=Layout.COL)


def variant(row, config_hash, ratio):
    """Another kernel variant of the same problem, as a store's leading rows hold it."""
    other = row.copy()
    other["config_hash"], other["kernel"], other["ratio"] = config_hash, f"kernel_{config_hash}", ratio
    return other


def test_covered_takes_the_models_problems_the_table_has_torch_first(frame):
    table = BestTable(frame)
    wanted = problem_of(frame.iloc[1])
    other = dataclasses.replace(wanted, m=4000)  # not tuned: a dense problem is covered only exactly
    found = covered(table, [wanted, other])
    assert [c.problem for c in found] == [frame.iloc[1]["problem"]]
    assert found[0].names == {wanted.name}
    assert [c.label for c in found[0].candidates][0] == TORCH and found[0].candidates[0].is_torch
    assert found[0].candidates[1].row["config_hash"] == frame.iloc[1]["config_hash"]


def test_covered_takes_a_stores_leading_variants_up_to_top(frame):
    row = frame.iloc[0]
    leading = pd.DataFrame([row, variant(row, "b" * 16, 1.04), variant(row, "c" * 16, 1.03)])
    found = covered(BestTable(frame), [problem_of(row)], leading, top=2)
    assert [c.row["config_hash"] for c in found[0].candidates[1:]] == [row["config_hash"], "b" * 16]
    found = covered(BestTable(frame), [problem_of(row)], leading, top=3)
    assert len(found[0].candidates) == 4


def test_a_table_without_the_models_problems_is_one_line(frame):
    with pytest.raises(InModelError, match=r"the table has none of the model's 1 GEMM problems \(1x2x3") as info:
        covered(BestTable(frame), [dataclasses.replace(problem_of(frame.iloc[0]), m=1, n=2, k=3)])
    assert "\n" not in str(info.value)


def two_problems(frame):
    a, b = frame.iloc[0], frame.iloc[1]
    return [Covered(a["problem"], frozenset({a["problem"]}),
                    (Candidate(TORCH), Candidate("a1", a), Candidate("a2", variant(a, "a2" * 8, 1.0)))),
            Covered(b["problem"], frozenset({b["problem"]}), (Candidate(TORCH), Candidate("b1", b)))]


def test_the_rotation_runs_candidate_i_of_every_problem_in_step_i(frame):
    problems = two_problems(frame)
    steps = schedule(problems)
    a, b = problems[0].problem, problems[1].problem
    assert [(s[a].label, s[b].label) for s in steps] == [(TORCH, TORCH), ("a1", "b1"), ("a2", "b1")]


def test_a_steps_table_holds_its_candidates_rows_and_the_rest(frame):
    problems = two_problems(frame)
    steps = schedule(problems)
    assert step_frame(frame, steps[0]).empty  # torch's step: no row, so no nearest kernel either
    third = step_frame(frame, steps[2])
    assert len(third) == len(frame) and list(third.columns) == list(frame.columns)
    mine = third.set_index("problem")
    assert mine.loc[problems[0].problem, "config_hash"] == "a2" * 8
    assert mine.loc[problems[1].problem, "config_hash"] == frame.iloc[1]["config_hash"]
    assert (mine.loc[[problems[0].problem, problems[1].problem], "in_model_ratio"] == HELD).all()
    untouched = frame.iloc[2]["problem"]
    assert math.isnan(mine.loc[untouched, "in_model_ratio"])
    # the dispatcher runs the candidate whatever its claim (a ratio below min_ratio included)
    low = step_frame(frame, {problems[0].problem: Candidate("low", variant(frame.iloc[0], "d" * 16, 0.5))})
    match = BestTable(low).find(4096, 6656, 6656, problem_of(frame.iloc[0]).operation)
    assert match.row["config_hash"] == "d" * 16 and match.dispatch_ratio()[0] == HELD


@dataclasses.dataclass
class Kernel:
    duration: float


@dataclasses.dataclass
class Span:
    start: float
    end: float


@dataclasses.dataclass(eq=False)
class Event:
    """A recorded profiler event: what `FunctionEvent` gives."""

    name: str
    kernels: list = dataclasses.field(default_factory=list)
    cpu_children: list = dataclasses.field(default_factory=list)
    cpu_parent: object = None
    id: int = 0
    device_type: str = "DeviceType.CPU"
    time_range: Span = dataclasses.field(default_factory=lambda: Span(0.0, 0.0))
    is_user_annotation: bool = False


def tree(name, *children, kernels=(), id=0):
    event = Event(name, [Kernel(k) for k in kernels], list(children), id=id)
    for c in children:
        c.cpu_parent = event
    return event


def gpu_kernel(correlation, us):
    return Event("void cutlass::device_kernel<...>", id=correlation, device_type="DeviceType.CUDA",
                 time_range=Span(1000.0, 1000.0 + us))


def flat(*roots):
    """Every event of the trees, as `prof.events()` lists them."""
    out = []
    for r in roots:
        out.append(r)
        out.extend(flat(*r.cpu_children))
    return out


def test_kernels_are_attributed_to_the_problem_of_their_range_per_step():
    door = RANGE_PREFIX + "p-as-called"
    steps = [
        tree(STEP_PREFIX + "0",
             tree("aten::linear", tree(door, tree("aten::_grouped_mm", kernels=[10.0])), kernels=[99.0]),
             tree(door, kernels=[5.0, 1.0]),
             tree(RANGE_PREFIX + "not-in-the-table", kernels=[50.0])),
        tree(STEP_PREFIX + "1", tree(door, kernels=[7.5])),
    ]
    outside = tree(door, kernels=[1000.0])  # not in a step: warm-up
    times = kernel_times(flat(*steps, outside), {"p-as-called": "P"})
    assert times == {0: {"P": 16.0}, 1: {"P": 7.5}}
    # the calls a step made (the times are their sum): the store keeps a call's time
    assert call_counts(flat(*steps, outside), {"p-as-called": "P"}) == {0: {"P": 2}, 1: {"P": 1}}


def test_a_kernel_launched_through_ctypes_is_found_by_its_launchs_correlation():
    """Guards the ctypes launch: the profiler may link its kernel to the operator around the range,
    not to the range; the launch call under the range names it by correlation id."""
    door = RANGE_PREFIX + "p"
    step = tree(STEP_PREFIX + "0", tree("cutlass_tune::grouped_mm", tree(door, tree("cuLaunchKernelEx", id=41)),
                                        kernels=[12.0]))
    other_step = tree(STEP_PREFIX + "1", tree(door, tree("aten::_grouped_mm", tree("cudaLaunchKernel", id=42),
                                                         kernels=[30.0])))
    times = kernel_times([*flat(step, other_step), gpu_kernel(41, 12.0), gpu_kernel(42, 30.0)], {"p": "P"})
    assert times == {0: {"P": 12.0}, 1: {"P": 30.0}}  # each kernel once, in its own step


def timed(medians_by_label, problems, rounds=3):
    """`kernel_times` of `rounds` rounds where each candidate takes its time (+-1 us by round)."""
    one = schedule(problems)
    steps = one * rounds
    times = {}
    for i, step in enumerate(steps):
        times[i] = {p: medians_by_label[c.label] + (i // len(one) % 3 - 1) for p, c in step.items()}
    return steps, times


def test_the_fastest_candidate_in_the_model_is_kept(frame):
    problems = two_problems(frame)
    steps, times = timed({TORCH: 100.0, "a1": 95.0, "a2": 90.0, "b1": 80.0}, problems)
    a, b = choose(problems, steps, times)
    assert (a.kept.label, a.best.label, a.ratio) == ("a2", "a2", pytest.approx(100 / 90))
    assert (b.kept.label, b.ratio) == ("b1", pytest.approx(100 / 80))
    assert a.samples == 3


def test_torch_is_kept_where_it_is_faster_and_at_a_tie(frame):
    problems = two_problems(frame)
    steps, times = timed({TORCH: 100.0, "a1": 105.0, "a2": 101.0, "b1": 100.0}, problems)
    a, b = choose(problems, steps, times)
    assert (a.kept.label, a.best.label, a.ratio) == (TORCH, "a2", pytest.approx(100 / 101))
    assert (b.kept.label, b.ratio) == (TORCH, pytest.approx(1.0))


def test_a_candidate_never_timed_is_one_line(frame):
    problems = two_problems(frame)
    steps, times = timed({TORCH: 100.0, "a1": 95.0, "a2": 90.0, "b1": 80.0}, problems)
    for i, step in enumerate(steps):
        if step[problems[0].problem].label == "a2":
            del times[i][problems[0].problem]
    with pytest.raises(InModelError, match=r"no kernel time inside the model for a2"):
        choose(problems, steps, times)


def test_the_table_written_holds_the_in_model_kernel_and_ratio_the_dispatcher_reads(frame):
    problems = two_problems(frame)
    steps, times = timed({TORCH: 100.0, "a1": 95.0, "a2": 90.0, "b1": 105.0}, problems)
    out = tuned_frame(frame, choose(problems, steps, times))
    assert len(out) == len(frame) and list(out.columns) == list(frame.columns)
    mine = out.set_index("problem")
    assert mine.loc[problems[0].problem, "config_hash"] == "a2" * 8
    assert mine.loc[problems[0].problem, "in_model_ratio"] == pytest.approx(100 / 90)
    assert mine.loc[problems[1].problem, "in_model_ratio"] == pytest.approx(100 / 105)
    assert math.isnan(mine.loc[frame.iloc[2]["problem"], "in_model_ratio"])
    table = BestTable(out)
    kept = table.find(4096, 6656, 6656, problem_of(frame.iloc[0]).operation)
    assert kept.dispatch_ratio()[0] == pytest.approx(100 / 90)
    # torch kept: the figure the dispatcher holds min_ratio 1.0 against is below it
    row = frame.iloc[1]
    slower = table.find(int(row["m"]), int(row["n"]), int(row["k"]), problem_of(row).operation)
    ratio, source = slower.dispatch_ratio()
    assert ratio < 1.0 and "inside the model" in source


def test_the_duty_cycle_of_the_profiled_steps_is_an_as_captured_regime():
    # kernels 0-60, 50-80 (overlapping: one busy span), 90-100, 130-190: busy 150 of 190, gaps 10 and 30
    events = [Event("k", device_type="DeviceType.CUDA", time_range=Span(a, b))
              for a, b in [(0, 60), (50, 80), (90, 100), (130, 190)]] + [tree("cpu op")]
    spec = duty_cycle(kernel_spans(events))
    assert spec is not None and spec.name == f"as-captured:{round(150 / 190, 3):g}:20us"
    assert duty_cycle([(0, 10), (10, 20)]) is None and duty_cycle([]) is None  # never idle, nothing run


def test_a_range_shown_on_the_gpu_is_neither_a_kernel_nor_busy_time():
    """Regression: a range open around native launches (the problem's, the step's) is a GPU user
    annotation spanning its kernels; counted as a kernel it doubled the kernel time and made
    the whole step busy."""
    door = RANGE_PREFIX + "p"
    launch = Event("cudaLaunchKernel", id=7)
    step = tree(STEP_PREFIX + "0", tree(door, launch))
    kernel = gpu_kernel(7, 40.0)
    shown = Event(door, id=7, device_type="DeviceType.CUDA", time_range=Span(990.0, 1100.0), is_user_annotation=True)
    whole = Event(STEP_PREFIX + "0", device_type="DeviceType.CUDA", time_range=Span(0.0, 5000.0),
                  is_user_annotation=True)
    assert kernel_times(flat(step) + [kernel, shown, whole], {"p": "P"}) == {0: {"P": 40.0}}
    assert kernel_spans([kernel, shown, whole]) == [(1000.0, 1040.0)]


def test_a_real_profiles_events_are_read_on_the_cpu():
    """torch.profiler's own events (no GPU: no kernels): the steps and the doors' ranges in them
    are found through the attributes `kernel_times` reads."""
    import torch

    x = torch.ones(8, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(2):
            with torch.profiler.record_function(f"{STEP_PREFIX}{i}"):
                with torch.profiler.record_function("outer"), torch.profiler.record_function(RANGE_PREFIX + "p"):
                    torch.mm(x, x)
                with torch.profiler.record_function(RANGE_PREFIX + "other"):
                    torch.mm(x, x)
    events = list(prof.events())
    assert kernel_times(events, {"p": "P"}) == {0: {"P": 0.0}, 1: {"P": 0.0}}
    assert kernel_spans(events) == []


@pytest.mark.parametrize("name, gemm", [
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...> >(...)", True),
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1", True),
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NTN", True),
    ("void build_group_arguments<Builder>(Builder)", True),
    ("triton_tem_fused_mm_0", True),
    ("void cutlass_tune::moe::gather_kernel<c10::BFloat16>(...)", False),
    ("void cutlass_tune::moe::combine_kernel<c10::BFloat16>(...)", False),
    ("triton_per_fused__to_copy_abs_amax_clamp_0", False),
    ("void at::native::vectorized_elementwise_kernel<4, ...>", False),
    ("void flash::flash_fwd_kernel<...>", False),
])
def test_gemm_kernels_are_told_by_name(name, gemm):
    assert is_gemm_kernel(name) is gemm


def test_a_steps_kernel_time_splits_into_gemms_and_the_rest_and_a_gain_into_its_parts():
    def kernel(name, us):
        return Event(name, device_type="DeviceType.CUDA", time_range=Span(0.0, us))

    shown = Event(RANGE_PREFIX + "p", device_type="DeviceType.CUDA", time_range=Span(0.0, 500.0),
                  is_user_annotation=True)
    # two steps: GEMMs 300 + 100 us, the rest 40 + 60 us; a range on the GPU and a CPU op count for nothing
    events = [kernel("sm90_xmma_gemm_bf16", 300.0), kernel("triton_poi_fused_add", 40.0), shown, tree("aten::mm"),
              kernel("cutlass::gemm::kernel", 100.0), kernel("cutlass_tune::moe::combine_kernel", 60.0)]
    split = step_split(events, steps=2)
    assert (split.gemm_us, split.other_us, split.kernels_us) == (200.0, 50.0, 250.0)
    # ours 1.0 ms a step (kernels 0.25), theirs 1.5 ms (GEMMs 0.3, the rest 0.05): 0.5 ms = 0.1 + 0 + 0.4
    gain = GainSplit.of(1.0, split, 1.5, StepSplit(300.0, 50.0))
    assert gain.total_ms == pytest.approx(0.5) and gain.gemm_ms == pytest.approx(0.1)
    assert gain.other_kernels_ms == pytest.approx(0.0) and gain.host_and_gaps_ms == pytest.approx(0.4)
