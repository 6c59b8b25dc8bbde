"""Hostile and sloppy search-space files: each is one line naming file, key and value, never a
traceback, and nothing is silently coerced or dropped."""

from pathlib import Path

import pytest

from cutlass_tune.errors import ConfigFileError
from cutlass_tune.space import Problem, check_problem, load_space
from cutlass_tune.space._rules import MAX_PROBLEM_DIM

from ..cli_run import cli

REPO = Path(__file__).resolve().parents[2]
PROBLEM = "problems: {m: 64, n: 64, k: 64}\n"


def write(tmp_path, content: str | bytes) -> Path:
    path = tmp_path / "space.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def error(tmp_path, content: str | bytes) -> ConfigFileError:
    path = write(tmp_path, content)
    with pytest.raises(ConfigFileError) as info:
        load_space(path)
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message and "\r" not in message
    return info.value


def test_non_utf8_file_is_one_line(tmp_path):
    """Guards against a UnicodeDecodeError traceback for a file that is not UTF-8."""
    e = error(tmp_path, b"\xff\xfe" + PROBLEM.encode())
    assert e.key == "line 1" and "not UTF-8" in e.problem and "0xff" in e.problem


def test_nul_byte_is_one_line_with_line_and_column(tmp_path):
    """Guards against PyYAML's second line ('in "<unicode string>", position N') in the error."""
    e = error(tmp_path, "description: x\nproblems: {m: 64,\x00 n: 64, k: 64}\n")
    assert e.key == "line 2, column 18"
    assert e.problem == "malformed YAML: unacceptable character #x0000: special characters are not allowed"


@pytest.mark.parametrize("text,where,problem", [
    ("problems: [{m: 1, n: 1, k: 1}\n", "line 2, column 1", "expected ',' or ']'"),
    ("problems:\n\t- {m: 1}\n", "line 2, column 1", "found character '\\t' that cannot start"),
    (PROBLEM + "---\nx: 1\n", "line 2, column 1", "expected a single document"),
    ("problems: !!python/object:os.system {}\n", "line 1, column 11", "could not determine a constructor"),
    (PROBLEM + "x: " + "[" * 5000 + "]" * 5000 + "\n", "", "nested too deeply"),
    ("problems: {m: 1" + "0" * 5000 + ", n: 64, k: 64}\n", "", "cannot read a value"),
    (PROBLEM + "when: 2024-13-01\n", "", "cannot read a value (month must be in 1..12)"),
], ids=["unclosed", "tab", "two documents", "python tag", "deep", "5001 digits", "bad date"])
def test_malformed_yaml_is_one_line(tmp_path, text, where, problem):
    """Guards against PyYAML's multi-line messages (source excerpts) and its RecursionError and
    ValueError tracebacks."""
    e = error(tmp_path, text)
    assert e.key == where and e.problem.startswith("malformed YAML: ") and problem in e.problem


def test_long_yaml_message_is_cut_short(tmp_path):
    """Guards against PyYAML quoting a huge piece of the file (here a tag) into the error line."""
    e = error(tmp_path, PROBLEM + "x: !" + "a" * 5000 + " 1\n")
    assert len(e.problem) < 250 and e.problem.endswith("...")


def test_newline_in_key_or_value_is_escaped(tmp_path):
    """Guards against a line break in an echoed key or value splitting the error line."""
    e = error(tmp_path, PROBLEM + '"col\\nour": 1\n')
    assert e.key == "col\\nour" and str(e).endswith(": col\\nour = 1: unknown key")
    e = error(tmp_path, PROBLEM + 'kernels: {kernel_schedule: "warp\\ndrive"}\n')
    assert e.key == "kernels.0.kernel_schedule.0" and "'warp\\ndrive'" in str(e)


@pytest.mark.parametrize("text", [
    PROBLEM + "extra: [" + ", ".join(["1"] * 5_000) + "]\n",  # 15 KB echoed whole (200,000: 8 s of YAML parsing)
    PROBLEM + "extra: " + "x" * 200_000 + "\n",
    PROBLEM + "? " + "k" * 200_000 + "\n: 1\n",
    PROBLEM + "kernels: {kernel_schedule: " + "x" * 200_000 + "}\n",
    PROBLEM + "extra: " + "[" * 200 + "]" * 200 + "\n",
], ids=["long list", "long value", "long key", "long enum value", "deep list"])
def test_echoed_keys_and_values_are_truncated(tmp_path, text):
    """Guards against a megabyte error line from echoing a huge key or value whole."""
    e = error(tmp_path, text)
    assert len(str(e)) < len(str(tmp_path)) + 300 and "..." in str(e)


def test_alias_bomb_is_echoed_without_expanding_it(tmp_path):
    """Guards against walking a value that aliases make exponentially large (10**8 leaves)."""
    levels = ["  - &a0 [" + ", ".join(["x"] * 10) + "]"]
    levels += [f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    e = error(tmp_path, PROBLEM + "extra:\n" + "\n".join(levels) + "\n")
    assert e.key == "extra" and len(str(e)) < len(str(tmp_path)) + 300


EMPTY_LISTS = [
    ("problems: []\n", "problems"),
    ("problems: {m: [], n: 64, k: 64}\n", "problems.0.m"),
    ("problems: {m: 64, n: [], k: 64}\n", "problems.0.n"),
    ("problems: {m: 64, n: 64, k: []}\n", "problems.0.k"),
    (PROBLEM + "dtypes: []\n", "dtypes"),
    (PROBLEM + "layouts: []\n", "layouts"),
    (PROBLEM + "kernels: []\n", "kernels"),
    (PROBLEM + "runtime: {raster: []}\n", "runtime.raster"),
    (PROBLEM + "runtime: {swizzle: []}\n", "runtime.swizzle"),
    (PROBLEM + "runtime: {splits: []}\n", "runtime.splits"),
    (PROBLEM + "runtime: {decomposition: []}\n", "runtime.decomposition"),
] + [
    (PROBLEM + f"kernels: {{{knob}: []}}\n", f"kernels.0.{knob}")
    for knob in ("tile_m", "tile_n", "tile_k", "cluster", "stages", "kernel_schedule",
                 "epilogue_schedule", "tile_scheduler", "fp8_fast_accum", "epilogue_tile_n",
                 "epilogue_source")
]


@pytest.mark.parametrize("text,key", EMPTY_LISTS)
def test_empty_lists_are_rejected(tmp_path, text, key):
    """Guards against an empty list silently giving 0 problems, configs or run-time variants."""
    e = error(tmp_path, text)
    assert (e.key, e.value, e.problem) == (key, [], "must not be empty")


@pytest.mark.parametrize("text,key,value", [
    ("problems: {m: true, n: 64, k: 64}\n", "problems.0.m.0", True),
    ("problems: {m: '1024', n: 64, k: 64}\n", "problems.0.m.0", "1024"),
    ("problems: {m: 64, n: [64, 1024.0], k: 64}\n", "problems.0.n.1", 1024.0),
    ("problems: {m: 64, n: 64, k: null}\n", "problems.0.k.0", None),
    (PROBLEM + "kernels: {tile_m: '128'}\n", "kernels.0.tile_m.0", "128"),
    (PROBLEM + "kernels: {tile_n: 128.0}\n", "kernels.0.tile_n.0", 128.0),
    (PROBLEM + "kernels: {tile_k: true}\n", "kernels.0.tile_k.0", True),
    (PROBLEM + "runtime: {swizzle: '2'}\n", "runtime.swizzle.0", "2"),
    (PROBLEM + "runtime: {splits: 2.0}\n", "runtime.splits.0", 2.0),
])
def test_integers_are_not_coerced(tmp_path, text, key, value):
    """Guards against true, "1024" or 1024.0 being taken as an integer."""
    e = error(tmp_path, text)
    assert e.key == key and "must be a plain integer" in e.problem
    assert e.value == value or value is None and e.value == "None"


@pytest.mark.parametrize("text,key,value", [
    (PROBLEM + "kernels: {stages: 4.0}\n", "kernels.0.stages.0", 4.0),
    (PROBLEM + "kernels: {stages: '4'}\n", "kernels.0.stages.0", "4"),
    (PROBLEM + "kernels: {cluster: [2.0, 1]}\n", "kernels.0.cluster.0", 2.0),
    (PROBLEM + "kernels: {cluster: [[true, 1]]}\n", "kernels.0.cluster.0", [True, 1]),
    (PROBLEM + "kernels: {cluster: '\u00b2x1'}\n", "kernels.0.cluster.0", "\u00b2x1"),
    (PROBLEM + "kernels: {epilogue_tile_n: 64.0}\n", "kernels.0.epilogue_tile_n.0", 64.0),
    (PROBLEM + "kernels: {epilogue_tile_n: '64'}\n", "kernels.0.epilogue_tile_n.0", "64"),
])
def test_knobs_with_their_own_parsers_refuse_non_integers(tmp_path, text, key, value):
    """Guards against knobs parsed by hand (stages, cluster, epilogue tile) accepting floats,
    strings or bools, or a non-ASCII digit raising from int()."""
    e = error(tmp_path, text)
    assert e.key == key and e.value == value


def test_documented_forms_still_parse(tmp_path):
    """Guards against strict integers refusing the documented spellings of knobs."""
    sp = load_space(write(tmp_path, """
problems: [{m: [64, 128], n: 64, k: 64}, {m: 2147483647, n: 64, k: 64}]
dtypes: [bf16, {input: f16, output: f32}]
layouts: tt
kernels:
  - {tile_m: 128, tile_n: [128, 256], cluster: [1x1, 2X1, [1, 2]], stages: [auto, 4],
     epilogue_tile_n: [auto, 64], epilogue_schedule: [auto, no_smem]}
  - {cluster: [2, 1], stages: auto, epilogue_tile_n: auto, epilogue_source: false}
runtime: {raster: along_n, swizzle: [1, 8], splits: 2, decomposition: split_k}
"""))
    assert len(sp.problems) == 3 * 2
    assert {(c.cluster_m, c.cluster_n) for c in sp.candidates} == {(1, 1), (2, 1), (1, 2)}
    assert {c.stages for c in sp.candidates} == {0, 4}
    assert {c.epilogue_tile_n for c in sp.candidates} == {0, 64}
    assert sp.runtime.splits == [2] and sp.runtime.swizzle == [1, 8]


@pytest.mark.parametrize("size", ["2147483648", "4294967296", "99999999999999999999"])
def test_problem_sizes_fit_the_kernels_int32_shape(tmp_path, size):
    """Guards against sizes past INT32_MAX, which the kernels' int problem shape would wrap."""
    e = error(tmp_path, f"problems: {{m: 64, n: 64, k: [64, {size}]}}\n")
    assert e.key == "problems.0.k.1" and e.value == int(size) and "2147483647" in e.problem


def test_check_problem_refuses_sizes_past_int32():
    """Guards against matmul and benchmark jobs passing a size the kernel would truncate."""
    assert MAX_PROBLEM_DIM == 2**31 - 1
    assert check_problem(Problem(64, MAX_PROBLEM_DIM + 1, 64))[0].rule == "shape"
    assert check_problem(Problem(MAX_PROBLEM_DIM, 64, 64)) == []


@pytest.mark.parametrize("text,key,at", [
    (PROBLEM + "problems: {m: 128, n: 64, k: 64}\n", "problems",
     "at line 2, column 1; first given at line 1, column 1"),
    ("problems: {m: 64, n: 64, k: 64, m: 128}\n", "problems.m", "at line 1, column 33"),
    (PROBLEM + "kernels:\n  - {tile_m: 128}\n  - {tile_n: 64, tile_n: 128}\n", "kernels.1.tile_n", "line 4"),
    (PROBLEM + "runtime:\n  swizzle: 1\n  'swizzle': 2\n", "runtime.swizzle", "line 4"),
])
def test_duplicate_keys_are_rejected(tmp_path, text, key, at):
    """Guards against PyYAML silently keeping the last of a key given twice."""
    e = error(tmp_path, text)
    assert e.key == key and e.problem.startswith("duplicate key") and at in e.problem


def test_merge_keys_may_be_overridden(tmp_path):
    """Guards against the duplicate-key check refusing YAML merges (`<<: *anchor`)."""
    sp = load_space(write(tmp_path, """
problems:
  - &square {m: 64, n: 64, k: 64}
  - {<<: *square, m: 128}
"""))
    assert [p.m for p in sp.problems] == [64, 128]


def test_enum_message_lists_every_allowed_value(tmp_path):
    """Guards against `epilogue_schedule: fancy` listing only 'auto' as allowed."""
    e = error(tmp_path, PROBLEM + "kernels: {epilogue_schedule: fancy}\n")
    assert (e.key, e.value) == ("kernels.0.epilogue_schedule.0", "fancy")
    assert e.problem == "epilogue_schedule must be auto, tma, tma_cooperative or no_smem"


@pytest.mark.parametrize("text,key", [
    ("kernels: {tile_m: 128}\n", "problems"),
    ("problems: {m: 64, n: 64}\n", "problems.0.k"),
    (PROBLEM + "dtypes: [{input: f16}]\n", "dtypes.0.output"),
])
def test_missing_key_is_named_not_its_parent(tmp_path, text, key):
    """Guards against echoing the parent mapping as the value of a missing required key."""
    e = error(tmp_path, text)
    assert (e.key, e.value, e.problem) == (key, None, "required key missing")
    assert str(e).endswith(f": {key}: required key missing")


def test_cli_reports_a_non_utf8_file_on_one_line(tmp_path):
    """Guards against the CLI printing a traceback (exit 1) for a file that is not UTF-8."""
    path = write(tmp_path, b"\xff\xfe" + PROBLEM.encode())
    r = cli("space", path)  # in this process: the command's output and exit code
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"error: {path}: line 1: not UTF-8 text (byte 0xff at offset 0)"]
