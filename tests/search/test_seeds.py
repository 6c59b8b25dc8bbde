import pathlib
import sys

import pytest

from cutlass_tune.measurement import Measurement
from cutlass_tune.search import COMMON_DEFAULTS, _seeds, seed_configs
from cutlass_tune.search._seeds import heuristic_configs
from cutlass_tune.space import (
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    RuntimeArgs,
    check_config,
    load_space,
)
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore

from .fakes import space_of
from .test_sweep import SPACE, SPACE_WITHOUT_C


@pytest.fixture
def space(tmp_path):
    return space_of(tmp_path, SPACE)


@pytest.fixture
def store(tmp_path):
    s = ResultStore(f"sqlite:///{tmp_path / 's.sqlite'}")
    s.bind_gpu("NVIDIA H200")
    return s


def test_without_the_heuristics_package_seeds_are_cutlass_defaults(space, store, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    seeds = seed_configs(space, store, list(space.problems), "NVIDIA H200")
    members = {c.hash for c in space.candidates}
    assert seeds and all(c.hash in members and not check_config(c) for c in seeds)
    assert seeds[0].name == "bf16_tn_128x128x64_c1x2_sauto_pingpong_tma_persistent"
    assert len(seeds) <= len(COMMON_DEFAULTS)


def test_the_best_of_the_nearest_stored_problem_is_a_seed(space, store, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    winner = KernelConfig(tile_m=64, tile_n=64, kernel_schedule=KernelSchedule.PINGPONG,
                          epilogue_schedule=EpilogueSchedule.TMA)
    store.add(Measurement(problem=Problem(2048, 4096, 4096), config=winner, runtime=RuntimeArgs(),
                          status=Status.OK, tflops=650.0), gpu="NVIDIA H200", run_id="r")
    seeds = seed_configs(space, store, list(space.problems), "NVIDIA H200")
    assert winner.hash in {c.hash for c in seeds}


def test_performance_model_picks_lead_the_seeds(space, store):
    pytest.importorskip("nvMatmulHeuristics")
    picks = {p: heuristic_configs(p, "NVIDIA H200") for p in space.problems}
    assert all(found for found in picks.values())
    assert all(not check_config(c) for found in picks.values() for c in found)
    members = {c.hash for c in space.candidates}
    first_in_space = next(c for c in picks[space.problems[0]] if c.hash in members)
    seeds = seed_configs(space, store, list(space.problems), "NVIDIA H200")
    assert seeds[0] == first_in_space


def test_fp8_seeds_are_the_fp8_defaults_with_128_wide_k(tmp_path, store, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    path = tmp_path / "fp8.yaml"
    path.write_text("problems: [{m: 4096, n: 4096, k: 4096}]\n"
                    "dtypes: [{input: e4m3, output: bf16}]\n"
                    "kernels: {tile_m: [128], tile_n: [128, 192, 256], tile_k: [64, 128], cluster: [1x1, 1x2, 2x1],\n"
                    "          kernel_schedule: [cooperative, pingpong], fp8_fast_accum: [true, false]}\n")
    fp8 = load_space(path)
    seeds = seed_configs(fp8, store, list(fp8.problems), "NVIDIA H200")
    assert seeds and all(c.tile_k == 128 and not check_config(c) for c in seeds)
    assert seeds[0].name == "e4m3_bf16bf16_tn_128x128x128_c2x1_sauto_pingpong_tma_persistent_fastaccum"
    assert [c.fp8_fast_accum for c in seeds[:4]] == [True, True, True, False]  # the promoting one last


def test_seeds_drop_the_c_operand_where_the_space_allows(space, tmp_path, store, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    path = tmp_path / "nosrc.yaml"
    path.write_text(SPACE_WITHOUT_C)
    both = load_space(path)
    seeds = seed_configs(both, store, list(both.problems), "NVIDIA H200")
    assert seeds and all(not c.epilogue_source and not check_config(c) for c in seeds)
    assert seeds[0].name == "bf16_tn_128x128x64_c1x2_sauto_pingpong_tma_persistent_nosrc"
    # The same defaults, keeping C, where the space lists only kernels with it.
    plain = seed_configs(space, store, list(both.problems), "NVIDIA H200")
    assert [c.name + "_nosrc" for c in plain] == [c.name for c in seeds]


def test_the_square_benchmark_seeds_every_kernel_family_that_won_it_in_one_batch(store, monkeypatch):
    """The 64x64 plain kernel won 128^3-512^3 on both GPUs but came 17th-43rd from the sampler."""
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    squares = load_space(pathlib.Path(__file__).resolve().parents[2] / "configs" / "squares_bf16.yaml")
    seeds = seed_configs(squares, store, list(squares.problems), "NVIDIA H100 80GB HBM3")
    names = [c.name for c in seeds]
    assert len(names) <= 16  # the first compile batch on a 16-core host
    for winner in ("64x64x64_c1x1_sauto_tma_ws", "128x64x64_c1x1_sauto_tma_ws", "64x128x64_c1x1_sauto_tma_ws",
                   "128x128x64_c1x2_sauto_pingpong", "128x192x64_c2x1_sauto_pingpong",
                   "128x256x64_c1x2_sauto_cooperative"):
        assert f"bf16_tn_{winner}_tma_persistent_nosrc" in names or \
            f"bf16_tn_{winner}_tma_cooperative_persistent_nosrc" in names, winner


SKINNY = """
problems:
  - {m: 4096, n: 1280, k: 8192}
  - {m: 4096, n: 4096, k: 4096}
dtypes: [bf16]
layouts: [tn]
kernels:
  tile_m: [64, 128, 256]
  tile_n: [64, 128, 160, 192, 256]
  cluster: [1x1, 1x2]
  kernel_schedule: [tma_ws, cooperative, pingpong]
  tile_scheduler: [persistent, stream_k]
  epilogue_source: [false, true]
"""


def test_a_tile_that_fills_the_waves_joins_the_seeds_where_the_defaults_fit_badly(tmp_path, store, monkeypatch):
    """4096x1280: 128x256 tiles are 1.2 waves on 132 SMs, 128x192 ping-pong leaves 19% of one
    idle; 256x160 is 128 tiles, 0.97 of a wave (it measured 1.00 of cuBLAS, the defaults 0.92)."""
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    path = tmp_path / "skinny.yaml"
    path.write_text(SKINNY)
    space = load_space(path)
    skinny, square = space.problems
    without = seed_configs(space, store, [skinny, square], "NVIDIA H100 80GB HBM3")
    seeds = seed_configs(space, store, [skinny, square], "NVIDIA H100 80GB HBM3", sm_count=132)
    added = [c for c in seeds if c not in without]
    assert [c.name for c in added] == ["bf16_tn_256x160x64_c1x1_sauto_cooperative_tma_cooperative_persistent_nosrc",
                                       "bf16_tn_128x160x64_c1x1_sauto_pingpong_tma_persistent_nosrc"]
    assert _seeds.wave_fill(added[0], skinny, 132) == pytest.approx(128 / 132)
    assert _seeds.wave_fill(added[1], skinny, 132) == pytest.approx(256 / 264)
    # the square fits the defaults' tiles: nothing added for it, alone or with more SMs
    assert seed_configs(space, store, [square], "GPU", sm_count=132) == seed_configs(space, store, [square], "GPU")


WIDE = """
problems:
  - {m: 4096, n: 6656, k: 6656}
  - {m: 1024, n: 1024, k: 1024}
dtypes: [bf16]
layouts: [tn]
kernels:
  tile_m: [64, 128, 256]
  tile_n: [64, 128, 192, 208, 256]
  cluster: [1x1, 1x2]
  kernel_schedule: [tma_ws, cooperative, pingpong]
  epilogue_source: [false, true]
"""


def test_small_default_tiles_that_fill_the_waves_do_not_hide_a_large_tile_that_fits(tmp_path, store, monkeypatch):
    """4096x6656 (LLaMA-33B's o projection): the 64x128 ping-pong default fills 97% of its
    13 waves, the large defaults 90% of 7; 6656 = 32 x 208, and 128x208 ping-pong, 0.97 of 4
    waves, beat every default there. At 1024^3 no large tile fills 90% of a wave: nothing added."""
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    path = tmp_path / "wide.yaml"
    path.write_text(WIDE)
    space = load_space(path)
    wide, small = space.problems
    without = seed_configs(space, store, [wide], "GPU")
    added = [c.name for c in seed_configs(space, store, [wide], "GPU", sm_count=132) if c not in without]
    assert added == ["bf16_tn_256x208x64_c1x1_sauto_cooperative_tma_cooperative_persistent_nosrc",
                     "bf16_tn_128x208x64_c1x1_sauto_pingpong_tma_persistent_nosrc"]
    small_default = KernelConfig(tile_m=64, tile_n=128, kernel_schedule=KernelSchedule.PINGPONG,
                                 epilogue_schedule=EpilogueSchedule.TMA, epilogue_source=False)
    assert small_default in without and _seeds.wave_fill(small_default, wide, 132) == pytest.approx(0.97, abs=0.005)
    assert seed_configs(space, store, [small], "GPU", sm_count=132) == seed_configs(space, store, [small], "GPU")


def test_wave_fill_counts_whole_waves_and_ping_pong_pairs():
    p = Problem(4096, 1280, 8192)
    coop = KernelConfig(tile_m=128, tile_n=256)  # 160 tiles: two waves of 132
    assert _seeds.wave_fill(coop, p, 132) == pytest.approx(160 / 264)
    pong = KernelConfig(tile_m=128, tile_n=192, kernel_schedule=KernelSchedule.PINGPONG,
                        epilogue_schedule=EpilogueSchedule.TMA)  # 32 x 7 = 224 tiles of 264 slots, 1280 of 1344 columns
    assert _seeds.wave_fill(pong, p, 132) == pytest.approx(4096 * 1280 / (264 * 128 * 192))
