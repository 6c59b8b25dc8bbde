"""`kernels: auto` (space/_auto.py): counted and indexed without listing, as a list would be."""

import collections
import dataclasses
import itertools
import random
import time

import pytest

from cutlass_tune.errors import ConfigFileError
from cutlass_tune.space import (
    AutoKernels,
    DType,
    Epilogue,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Layout,
    Operation,
    Problem,
    Scaling,
    TileScheduler,
    check_config,
    load_space,
    space_for_shapes,
)
from cutlass_tune.space._rules import CONFIG_RULES, check_combinations
from cutlass_tune.space._spec import _auto_kernels as shared_walk  # the process's walk of a kind, as spaces share it

BF16 = Operation()
FP8 = Operation(dtype_a=DType.E4M3, dtype_b=DType.E4M3)
FP8_NT = dataclasses.replace(FP8, layout_a=Layout.COL, layout_b=Layout.ROW)
# A fusion that needs a TMA epilogue and a residual that needs C; fp8 scales with their rows in smem.
FUSED = Operation(epilogue=Epilogue.parse("bias+silu+residual"))
FP8_ROWCOL = dataclasses.replace(FP8, epilogue=Epilogue.parse("bias+gelu"), scaling=Scaling.ROWCOL)
FP8_BLOCKWISE = dataclasses.replace(FP8, scaling=Scaling.BLOCKWISE)
# MoE experts: cooperative or ping-pong, persistent, TMA epilogues; fp8 grouped kernels only with
# block-wise scales (tile K 128, tile N a multiple of 128, the FP8Blockwise schedules).
GROUPED = Operation(grouping=Grouping.GROUPED)
FP8_GROUPED = dataclasses.replace(FP8, grouping=Grouping.GROUPED)
FP8_GROUPED_BLOCKWISE = dataclasses.replace(FP8_BLOCKWISE, grouping=Grouping.GROUPED)
# Values that make every rule of check_config refuse some configs: tile K 256 of a 16-bit type,
# 4x4 clusters, ping-pong 128x224, only one stage of 256x208x128 beside its epilogue, fast
# accumulation of 16-bit inputs, an A/B swap outside fp8 row-wise, ...
SMALL = dict(tile_m=(64, 128, 256), tile_n=(16, 96, 208, 224), tile_k=(32, 128, 256),
             cluster=((1, 1), (2, 1), (4, 4)), stages=(0, 2, 9, 16), epilogue_tile_n=(0, 32, 48),
             fp8_fast_accum=(False, True), swap_ab=(False, True))


# The product the brute-force comparisons list one by one (each config judged by check_config, ~45 us):
# SMALL less tile N 224, 2 stages and epilogue tile 32, which no rule needs there: every operation below
# meets the same rules refusing it as over SMALL (a third of its configs; the test took 9-20 s each).
COUNTED = {**SMALL, "tile_n": (16, 96, 208), "stages": (0, 9, 16), "epilogue_tile_n": (0, 48)}


def test_the_counted_product_meets_the_rules_the_small_one_does():
    for operation in (BF16, FP8, FP8_NT, FUSED, FP8_ROWCOL, FP8_BLOCKWISE, GROUPED, FP8_GROUPED,
                      FP8_GROUPED_BLOCKWISE):
        small, counted = AutoKernels(operation, SMALL).census(), AutoKernels(operation, COUNTED).census()
        assert set(counted.invalid) == set(small.invalid) and bool(counted.valid) == bool(small.valid)


def brute_force(auto):
    """Every config of the product, one by one, with check_config's first reason."""
    knobs = [k for k, _ in auto.knobs]
    counts, valid = collections.Counter(), []
    for values in itertools.product(*(v for _, v in auto.knobs)):
        fields = {}
        for knob, value in zip(knobs, values):
            fields.update(zip(knob.fields, value if len(knob.fields) > 1 else (value,)))
        cfg = KernelConfig.for_operation(auto.operation, **fields)
        why = check_config(cfg)
        counts[why[0].rule if why else "valid"] += 1
        if not why:
            valid.append(cfg)
    return counts, valid


@pytest.mark.parametrize("operation", [BF16, FP8, FP8_NT, FUSED, FP8_ROWCOL, FP8_BLOCKWISE, GROUPED, FP8_GROUPED,
                                       FP8_GROUPED_BLOCKWISE],
                         ids=["bf16", "e4m3", "e4m3-nt", "bf16-fused", "e4m3-rowcol", "e4m3-blockwise",
                              "bf16-grouped", "e4m3-grouped", "e4m3-grouped-blockwise"])
def test_the_count_is_the_count_of_the_listed_product(operation):
    """Slow: lists the COUNTED product config by config (a few seconds per operation) to check the count against."""
    auto = AutoKernels(operation, COUNTED)
    counts, valid = brute_force(auto)
    census = auto.census()
    assert census.total == sum(counts.values()) == auto.total
    assert census.valid == counts.pop("valid", 0) == len(auto)
    assert census.invalid == counts
    assert set(census.examples) == set(counts)
    assert list(auto) == [auto[i] for i in range(len(auto))]
    assert sorted(c.hash for c in auto) == sorted(c.hash for c in valid)
    assert all(c in auto for c in valid[:: max(1, len(valid) // 200)])


def test_the_valid_configs_hold_with_narrow_b_scale_granularities():
    """Slow: lists its product config by config, as the count must be compared with."""
    # Valid configs only: the census names another rule than check_config for some block-wise
    # configs of tile N 128 that two rules refuse, as it did before scale_n (same counts on main).
    auto = AutoKernels(FP8_BLOCKWISE, {**COUNTED, "tile_n": (32, 64, 128), "scale_n": (32, 64, 128)})
    counts, valid = brute_force(auto)
    census = auto.census()
    assert census.valid == len(auto) == counts["valid"] and census.total == auto.total == sum(counts.values())
    assert sorted(c.hash for c in auto) == sorted(c.hash for c in valid)
    assert {c.scale_n for c in valid} == {32, 64, 128}
    assert all(c.tile_n == c.scale_n for c in valid if not c.swap_ab)
    # swapped, the scale block runs along the kernel's M (the weights' N): tile M takes it
    swapped = [c for c in valid if c.swap_ab]
    assert swapped and all(c.tile_m == c.scale_n and c.tile_n in (32, 64, 128) for c in swapped)


def test_every_rule_is_exercised_by_the_small_product():
    counts = collections.Counter()
    for operation in (BF16, FP8, FP8_NT, FUSED, GROUPED, FP8_GROUPED):
        counts.update(AutoKernels(operation, SMALL).census().invalid)
    # block-wise needs tile N of 128s (or scale_n's) to reach the rules after blockwise_tile
    counts.update(AutoKernels(FP8_BLOCKWISE, {**SMALL, "tile_n": (96, 128, 256)}).census().invalid)
    counts.update(AutoKernels(FP8_GROUPED_BLOCKWISE, {**SMALL, "tile_n": (64, 96, 128, 256),
                                                      "scale_n": (64, 128)}).census().invalid)
    # the operand rules refuse a kind whole: their own tests cover them
    assert {rule for rule, _ in CONFIG_RULES} - set(counts) == {"arch", "dtype_inputs", "dtype_output",
                                                               "dtype_accumulator", "operation", "scaling_inputs"}


def _random_config(rng, auto):
    fields = {}
    for knob, values in auto.knobs:
        value = rng.choice(values)
        fields.update(zip(knob.fields, value if len(knob.fields) > 1 else (value,)))
    return KernelConfig.for_operation(auto.operation, **fields)


def test_each_rule_reads_only_the_fields_it_declares():
    """Guards the count against a rule added to check_config, or changed, but not to CONFIG_RULES."""
    rng = random.Random(0)
    for operation in (BF16, FP8, GROUPED):
        auto = AutoKernels(operation)
        domain = {f: [] for knob, _ in auto.knobs for f in knob.fields}
        for knob, values in auto.knobs:
            for value in values:
                for f, v in zip(knob.fields, value if len(knob.fields) > 1 else (value,)):
                    domain[f].append(v)
        for _ in range(3000):
            cfg = _random_config(rng, auto)
            fired = {r.rule for r in check_combinations(cfg)}
            assert fired <= {rule for rule, _ in CONFIG_RULES}
            field = rng.choice(sorted(domain))
            other = dataclasses.replace(cfg, **{field: rng.choice(domain[field])})
            changed = fired ^ {r.rule for r in check_combinations(other)}
            assert all(field in reads for rule, reads in CONFIG_RULES if rule in changed), (cfg.name, field, changed)


@dataclasses.dataclass(frozen=True)
class _Walk:
    auto: AutoKernels
    seconds: float
    rule_checks: int


@pytest.fixture(scope="module")
def bf16_walk():
    """One fresh walk of the 16-bit kind (seconds), timed and with its rule checks counted, which
    the tests of its time, its checks and its indices share."""
    from cutlass_tune.space import _rules

    calls = 0
    real = _rules.check_combinations

    def counted(cfg):
        nonlocal calls
        calls += 1
        return real(cfg)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_rules, "check_combinations", counted)
        start = time.monotonic()
        auto = AutoKernels(BF16)
        auto.census()
        seconds = time.monotonic() - start
    return _Walk(auto, seconds, calls)


def test_a_16_bit_kind_is_counted_whole_in_seconds(bf16_walk):
    auto = bf16_walk.auto
    census = auto.census()
    assert bf16_walk.seconds < 20
    # 3 x 16 x 4 tiles, 9 clusters, 16 stage counts, 3 x 3 schedules, 2 tile schedulers,
    # 17 epilogue subtiles, with and without C
    assert census.total == 3 * 16 * 4 * 9 * 16 * 3 * 3 * 2 * 17 * 2
    assert census.valid == len(auto) == 190_240
    assert sum(census.invalid.values()) == census.total - census.valid
    picked = [auto[i] for i in random.Random(1).sample(range(len(auto)), 200)]
    assert all(not check_config(c) and c in auto for c in picked)
    names = {c.name for c in picked}
    assert len(names) == 200
    # tiles the hand-written space lacks are there: 128x160 and 128x192 ping-pong, without C
    wanted = KernelConfig.for_operation(BF16, tile_n=160, kernel_schedule=picked[0].kernel_schedule.PINGPONG,
                          epilogue_schedule=picked[0].epilogue_schedule.TMA, epilogue_source=False)
    assert wanted in auto and dataclasses.replace(wanted, tile_n=192) in auto
    assert dataclasses.replace(wanted, tile_n=224) not in auto  # accumulator_registers


def test_a_grouped_kind_holds_only_what_ptr_array_kernels_are_built_for():
    auto = shared_walk(GROUPED)
    census = auto.census()
    assert census.total == AutoKernels(BF16).total and 0 < census.valid == len(auto) < 190_240
    assert {"grouped_schedule", "grouped_epilogue"} <= set(census.invalid)
    seen = auto.values_in_valid()
    assert set(seen["kernel_schedule"]) == {KernelSchedule.PINGPONG, KernelSchedule.COOPERATIVE}
    assert seen["tile_scheduler"] == (TileScheduler.PERSISTENT,)
    assert all(e.value.startswith("tma") for e in seen["epilogue_schedule"])
    assert all(c.grouped and not check_config(c) for c in auto[:: max(1, len(auto) // 100)])
    assert AutoKernels(FP8_GROUPED).census().valid == 0


def test_indices_and_membership_agree(bf16_walk):
    auto = bf16_walk.auto
    for i in (0, 1, 777, len(auto) // 2, len(auto) - 1, -1):
        chosen = auto.value_indices(i)
        assert auto.config_of(chosen) == auto[i] and auto[i] in auto
    with pytest.raises(IndexError):
        auto[len(auto)]
    assert KernelConfig.for_operation(FP8) not in auto  # another kind
    assert KernelConfig.for_operation(BF16, tile_n=8 * 3) not in auto  # a value auto does not try
    assert sum(1 for _ in auto.all_value_indices()) == len(auto)


def test_a_space_file_of_kernels_auto(tmp_path):
    path = tmp_path / "auto.yaml"
    # Two kinds (each kind is walked, seconds apiece; the tn one is the process's shared walk): a
    # file's kinds are its dtypes times its layouts, whatever their number.
    path.write_text("problems: [{m: 4096, n: [1280, 4096], k: 8192}]\ndtypes: [bf16]\nlayouts: [tn, nt]\n"
                    "kernels: auto\nruntime: {swizzle: [1, 4]}\n")
    sp = load_space(path)
    assert len(sp.problems) == 4 and len(sp.auto) == 2
    census = sp.census()
    assert census.valid == len(sp.valid) == 2 * 190_240 and census.total == 2 * 16_920_576
    problem = Problem(4096, 1280, 8192, layout_a=Layout.COL, layout_b=Layout.ROW)
    kind = sp.auto_for(problem)
    assert kind is not None and kind.operation.layout_a is Layout.COL and kind.operation.dtype_a is DType.BF16
    assert sp.auto_for(dataclasses.replace(problem, dtype_a=DType.F16, dtype_b=DType.F16, dtype_d=DType.F16)) is None
    assert sp.holds(kind[5]) and not sp.holds(KernelConfig.for_operation(BF16, tile_n=8 * 3))
    first = next(iter(sp.classify()))
    assert first[1] == [] and first[0] == sp.candidates[0]
    assert [v.name for v in sp.runtime_variants(KernelConfig())] == ["rheuristic_sw1", "rheuristic_sw4"]


def test_the_knob_list_bound_does_not_refuse_auto(tmp_path):
    path = tmp_path / "auto.yaml"
    path.write_text("problems: [{m: 4096, n: 4096, k: 4096}]\nkernels: auto\n")
    assert load_space(path).census().total > 200_000


def test_shapes_without_a_file_are_auto_over_the_broad_run_time_variants():
    sp = space_for_shapes("4096x1280x8192, 512x14336x4096")
    assert [(p.m, p.n, p.k) for p in sp.problems] == [(4096, 1280, 8192), (512, 14336, 4096)]
    assert sp.auto and sp.path == "--shapes" and "4096x1280x8192" in sp.description
    assert len(sp.runtime_variants(KernelConfig())) == 6
    fp8 = space_for_shapes("256x256x256", dtype="e4m3")
    assert fp8.problems[0].dtype_d is DType.BF16 and fp8.auto[0].operation.dtype_a is DType.E4M3
    nt = space_for_shapes("256x256x256", dtype="f16:f32", layout="nt")
    assert (nt.problems[0].dtype_d, nt.problems[0].layout_a) == (DType.F32, Layout.COL)


def test_shapes_with_a_file_take_its_knobs(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("problems: [{m: 64, n: 64, k: 64}]\nlayouts: [nt]\nkernels: {tile_n: [64, 128]}\n")
    sp = space_for_shapes("4096x4096x4096", config=path)
    assert not sp.auto and len(sp.candidates) == 2 and sp.problems[0].layout_a is Layout.COL
    assert sp.problems[0].m == 4096


@pytest.mark.parametrize("shapes, dtype, layout, expected", [
    ("4096x4096", None, None, "--shapes = '4096x4096': give each shape as MxNxK"),
    ("4096x4096x4095", None, None, "--shapes: problems = '4096x4096x4095 tn': tma_alignment"),
    ("256x256x256", "e4m3", "nt", "fp8_layout"),
    ("256x256x256", "bf17", None, "--shapes: dtypes.0.input = 'bf17'"),
    ("256x256x256", None, "tx", "--shapes: layouts.0 = 'tx'"),
])
def test_bad_shapes_are_one_line(shapes, dtype, layout, expected):
    with pytest.raises(ConfigFileError, match=expected.replace("(", r"\(")) as err:
        space_for_shapes(shapes, dtype=dtype, layout=layout)
    assert "\n" not in str(err.value)


def test_an_fp8_rowcol_kind_holds_the_fp8_knobs_and_the_ab_swap():
    """Slow: walks the fp8 row-wise bias+gelu kind whole (the knob values it holds are the claim; the
    process keeps the walk for test_spec_epilogue.py's kind)."""
    from cutlass_tune.search._seeds import FP8_DEFAULTS, FP8_SMALL_M_DEFAULTS

    auto = shared_walk(FP8_ROWCOL)
    for knobs in FP8_DEFAULTS + FP8_SMALL_M_DEFAULTS:
        assert KernelConfig.for_operation(FP8_ROWCOL, epilogue_source=False, **knobs) in auto, knobs
    seen = auto.values_in_valid()
    assert set(seen["tile_k"]) >= {128, 256} and set(seen["swap_ab"]) == {False, True}
    assert set(seen["cluster"]) >= {(2, 1), (1, 2)} and set(seen["fp8_fast_accum"]) == {False, True}
    # every unswapped config has its swapped twin, and a few more fit: the swapped bias is a column
    # broadcast read from global memory, with no row in the epilogue's shared memory (counted in the
    # walk already made: a walk of the unswapped product alone took seconds)
    at = [knob.name for knob, _ in auto.knobs].index("swap_ab")
    swap_values = auto.knobs[at][1]
    unswapped = sum(1 for chosen in auto.all_value_indices() if not swap_values[chosen[at]])
    assert 0 < unswapped < auto.census().valid - unswapped
    # an fp8 kind without row-wise scales has no swapped kernel (the swapped product alone: its
    # rule refuses it early in the walk, where the whole kind's walk takes seconds)
    swapped = AutoKernels(FP8, {"swap_ab": (True,)}).census()
    assert swapped.valid == 0 and "swap_ab" in swapped.invalid


def test_the_walk_checks_each_rule_once_per_value_of_the_fields_it_reads(bf16_walk):
    # Guards the walk's speed (users wait on it in `space --shapes` and every kernels: auto sweep): it
    # ran every rule on all 311,297 branches of a 16-bit kind, where a rule's verdict depends on its
    # own fields alone (a cluster shape: 9 values); the leaves, whose smem rules read most fields, remain.
    auto = bf16_walk.auto
    assert auto.census().valid == 190_240
    leaves = len({tuple(auto.value_indices(i)[:-1]) for i in range(0, len(auto), 7)})  # some distinct leaf parents
    assert leaves < bf16_walk.rule_checks < 60_000
