"""Grouped (MoE experts) problems in space files and in `sweep --shapes`."""

import pytest

from cutlass_tune.errors import ConfigFileError
from cutlass_tune.space import Grouping, Problem, Routing, load_space, space_for_shapes, sweep_space


def write(tmp_path, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_a_grouped_block_gives_experts_rows_and_routing(tmp_path):
    sp = load_space(write(tmp_path, """
problems:
  - {experts: 128, n: 1536, k: 2048, rows: [32768, 4096], routing: [uniform, zipf]}
  - {experts: 4, n: 256, k: 256, routing: {histogram: [0, 10, 100, 1000]}}
  - {m: 64, n: 64, k: 64}
kernels: auto
"""))
    names = [p.name for p in sp.problems]
    assert names[:2] == ["32768x1536x2048_bf16bf16bf16_tn_grouped_e128-uniform",
                         "4096x1536x2048_bf16bf16bf16_tn_grouped_e128-uniform"]
    zipf = sp.problems[2]
    assert zipf == Problem.experts(128, 1536, 2048, 32768, routing=Routing.ZIPF)
    assert zipf.group_rows[0] > zipf.group_rows[-1] and sum(zipf.group_rows) == 32768
    histogram = sp.problems[4]
    assert histogram.m == 1110 and histogram.group_rows == (0, 10, 100, 1000)
    assert not sp.problems[5].grouped
    # one auto kind per operation: the grouped kind holds grouped configs only
    grouped = sp.auto_for(zipf)
    assert grouped is not None and grouped.operation.grouping is Grouping.GROUPED
    assert all(c.grouped for c in grouped[:50]) and sp.auto_for(sp.problems[5]) is not grouped


def test_the_file_routing_applies_to_blocks_without_their_own(tmp_path):
    sp = load_space(write(tmp_path, "problems: [{experts: 8, n: 256, k: 256, rows: 64}, "
                          "{experts: 8, n: 256, k: 256, rows: 64, routing: uniform}]\nrouting: [zipf]\n"))
    assert [p.routing for p in sp.problems] == [Routing.ZIPF, Routing.UNIFORM]


@pytest.mark.parametrize("block,key,message", [
    ("{experts: 0, n: 64, k: 64, rows: 64}", "problems.0.experts.0", "from 1 to 4096"),
    ("{experts: '4', n: 64, k: 64, rows: 64}", "problems.0.experts.0", "plain integer"),
    ("{experts: 4, n: 64, k: 64, rows: 64, routing: pareto}", "problems.0.routing.0", "uniform, zipf or"),
    ("{experts: 4, n: 64, k: 64, rows: 64, routing: histogram}", "problems.0.routing.0", "uniform, zipf or"),
    ("{experts: 4, n: 64, k: 64, rows: 64, routing: {histogram: [1, -2]}}", "problems.0.routing.0", "row counts"),
    ("{experts: 4, m: 64, n: 64, k: 64, rows: 64}", "problems.0", "not m"),
    ("{experts: 4, n: 64, k: 64}", "problems.0", "needs rows"),
    ("{m: 64, n: 64, k: 64, rows: 64}", "problems.0", "give experts too"),
    ("{experts: 4, n: 64, k: 64, rows: 64, routing: {histogram: [1, 2]}}", "problems", "4 whole counts"),
    ("{experts: 4, n: 64, k: 64, rows: 64, epilogue: bias}", "problems", "bias node is not built for grouped"),
])
def test_bad_grouped_blocks_are_one_line(tmp_path, block, key, message):
    with pytest.raises(ConfigFileError) as err:
        load_space(write(tmp_path, f"problems: [{block}]\n"))
    assert err.value.key == key and message in err.value.problem and "\n" not in str(err.value)


def test_a_file_routing_without_grouped_blocks_is_refused(tmp_path):
    with pytest.raises(ConfigFileError, match="routing: goes with grouped problem blocks"):
        load_space(write(tmp_path, "problems: [{m: 64, n: 64, k: 64}]\nrouting: zipf\n"))


def test_grouped_shapes_on_the_command_line():
    sp = space_for_shapes("e128:32768x1536x2048, 4096x4096x4096", routing="uniform,zipf")
    assert [p.name for p in sp.problems] == ["32768x1536x2048_bf16bf16bf16_tn_grouped_e128-uniform",
                                             "32768x1536x2048_bf16bf16bf16_tn_grouped_e128-zipf",
                                             "4096x4096x4096_bf16bf16bf16_tn"]
    assert len(sp.auto) == 2
    assert space_for_shapes("E8:16384x28672x4096").problems[0].routing is Routing.UNIFORM


@pytest.mark.parametrize("shapes,routing,expected", [
    ("e0:64x64x64", None, "--shapes: problems.0.experts.0 = 0: experts must be"),
    ("e4:64x64x64", "pareto", "--routing = 'pareto': give uniform or zipf"),
    ("64x64x64", "zipf", "--routing: goes with MoE shapes"),
    ("x4:64x64x64", None, "eE:ROWSxNxK"),
])
def test_bad_grouped_shapes_are_one_line(shapes, routing, expected):
    with pytest.raises(ConfigFileError) as err:
        space_for_shapes(shapes, routing=routing)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_routing_needs_shapes():
    with pytest.raises(ConfigFileError, match="--routing: goes with MoE shapes"):
        sweep_space("configs/moe_bf16.yaml", routing="zipf")


def test_the_shipped_moe_space():
    sp = load_space("configs/moe_bf16.yaml")
    assert len(sp.problems) == 12 and all(p.grouped for p in sp.problems)
    assert {p.routing for p in sp.problems} == {Routing.UNIFORM, Routing.ZIPF}
    assert {(p.groups, p.n, p.k, p.m) for p in sp.problems} == {
        (128, 1536, 2048, 32768), (128, 1536, 2048, 4096), (128, 2048, 768, 32768), (256, 512, 7168, 32768),
        (64, 2048, 2048, 65536), (8, 28672, 4096, 16384)}
    assert len(sp.auto) == 1 and sp.census().valid == len(sp.auto[0]) > 0
