"""Bounds on what a user's file may hold: a space whose lists multiply into millions of configs,
and files too large to read whole, are refused before the work, in one line."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutlass_tune import BestTable, load_best
from cutlass_tune._files import MAX_INPUT_BYTES
from cutlass_tune.errors import ConfigFileError
from cutlass_tune.space import load_space
from cutlass_tune.space._spec import MAX_CANDIDATES
from cutlass_tune.tables import BestTableError, BundleError, read_bundle

REPO = Path(__file__).resolve().parents[2]

# 8 x 16 x 5 x 5 x 4 x 4 x 6 = 307,200 combinations (> 200,000), in a few lines
HUGE = """
problems: {m: 4096, n: 4096, k: 4096}
kernels:
  tile_m: [64, 128, 192, 256, 64, 128, 192, 256]
  tile_n: [16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256]
  stages: [auto, 2, 3, 4, 5]
  cluster: [1x1, 2x1, 1x2, 2x2, 4x1]
  kernel_schedule: [cooperative, pingpong, tma_ws, cooperative]
  tile_scheduler: [persistent, stream_k, persistent, stream_k]
  epilogue_schedule: [auto, tma, auto, tma, auto, tma]
"""


def test_a_space_of_too_many_combinations_is_refused_before_expanding(tmp_path):
    # Guards against `cutlass-tune space` running for minutes on a file of ~10^6 configs.
    path = tmp_path / "huge.yaml"
    path.write_text(HUGE)
    started = time.monotonic()
    with pytest.raises(ConfigFileError, match=r"307,200 knob combinations, .*longest lists: tile_n 16, tile_m 8"):
        load_space(path)
    assert time.monotonic() - started < 2


def test_a_space_under_the_bound_loads(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("problems: {m: 4096, n: 4096, k: 4096}\nkernels:\n  tile_m: [64, 128, 256]\n"
                    "  tile_n: [64, 128, 192, 256]\n  stages: [auto, 2, 3, 4]\n  cluster: [1x1, 2x1, 1x2, 2x2]\n")
    assert 0 < len(load_space(path).candidates) <= MAX_CANDIDATES


def _sparse(path: Path) -> Path:
    with open(path, "wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)  # no disk written: a hole
    return path


@pytest.mark.parametrize("name", ["space.yaml", "table.csv", "table.json", "bundle"])
def test_an_oversized_input_file_is_refused_unread(tmp_path, name):
    # Guards against reading a 2 GB "space file" or table whole.
    if name == "bundle":
        (tmp_path / name).mkdir()
        _sparse(tmp_path / name / "manifest.json")
        with pytest.raises(BundleError, match="more than 64 MiB"):
            read_bundle(tmp_path / name)
        return
    path = _sparse(tmp_path / name)
    if name.endswith(".yaml"):
        with pytest.raises(ConfigFileError, match="more than 1 MiB"):
            load_space(path)
    else:
        for read in (load_best, BestTable.load):
            with pytest.raises(BestTableError, match="more than 64 MiB"):
                read(path)


def test_a_two_megabyte_space_file_is_refused_before_its_yaml_is_parsed(tmp_path):
    """Guards against a 2 MB space file taking 26-30 s of YAML parsing to be refused."""
    path = tmp_path / "space.yaml"
    path.write_text("problems:\n" + "".join(f"  - {{m: {64 + i}, n: 4096, k: 4096}}\n" for i in range(64_000)))
    assert path.stat().st_size > 2 << 20
    started = time.monotonic()
    with pytest.raises(ConfigFileError, match=r"more than 1 MiB: not a space file$"):
        load_space(path)
    assert time.monotonic() - started < 1


def test_space_files_are_parsed_by_libyaml_where_pyyaml_has_it():
    """Guards the parse of a space file against PyYAML's pure-Python parser (about 15 s a MB)."""
    import yaml

    from cutlass_tune.space import _spec

    assert _spec._LOADER is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


def test_a_device_without_end_is_refused_not_read_forever():
    with pytest.raises(ConfigFileError, match=r"not a regular file \(a character device\)"):
        load_space("/dev/zero")


def _reads_or_hangs(read, path: Path) -> BaseException:
    """What `read(path)` raised, run in a thread: a read that hangs fails the test instead of the run."""
    import threading

    raised: list[BaseException] = []

    def run() -> None:
        try:
            read(path)
        except BaseException as err:  # noqa: BLE001 (handed to the test)
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # lets the blocked open and read go on
        pytest.fail(f"{read.__qualname__} waited for a writer of the FIFO {path}")
    assert raised, read
    return raised[0]


@pytest.mark.parametrize("name", ["space.yaml", "best.csv", "best.json"])
def test_a_fifo_given_as_an_input_file_is_refused_at_once(name, tmp_path):
    """Guards against a FIFO given as a space file or a table hanging until a writer opened it."""
    path = tmp_path / name
    os.mkfifo(path)
    readers = [load_space] if name.endswith(".yaml") else [load_best, BestTable.load]
    for read in readers:
        err = _reads_or_hangs(read, path)
        assert isinstance(err, (ConfigFileError, BestTableError)), repr(err)
        assert str(err).endswith("not a regular file (a FIFO)"), str(err)


def test_the_cli_says_it_in_one_line(tmp_path):
    path = _sparse(tmp_path / "space.yaml")
    r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "space", str(path)], capture_output=True,
                       text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "more than 1 MiB" in r.stderr


def test_copies_in_a_run_time_list_are_one_variant_at_once(tmp_path):
    # Guards against a run-time list of many copies of a value costing seconds per config of a sweep.
    path = tmp_path / "copies.yaml"
    path.write_text("problems: {m: 4096, n: 4096, k: 4096}\nkernels: {tile_m: 128}\n"
                    f"runtime: {{swizzle: [{', '.join(['1'] * 1000)}], raster: [{', '.join(['along_n'] * 1000)}]}}\n")
    sp = load_space(path)
    started = time.monotonic()
    assert [v.name for v in sp.runtime_variants(sp.candidates[0])] == ["ralong_n_sw1"]
    assert time.monotonic() - started < 1


def test_the_most_problems_a_space_may_hold_load_at_once(tmp_path):
    # Guards against problems deduplicated by list search (10,000 took 19 s); more are refused.
    sizes = ", ".join(str(64 * i) for i in range(1, 101))
    path = tmp_path / "problems.yaml"
    path.write_text(f"problems: {{m: [{sizes}], n: [{sizes}], k: 4096}}\nkernels: {{tile_m: 128}}\n")
    started = time.monotonic()
    assert len(load_space(path).problems) == 10_000
    assert time.monotonic() - started < 5
    path.write_text(f"problems: {{m: [{sizes}, 6464], n: [{sizes}], k: 4096}}\nkernels: {{tile_m: 128}}\n")
    with pytest.raises(ConfigFileError, match="10,100 problems, more than the 10,000"):
        load_space(path)
