"""Bundles (`cutlass-tune export`): a best-config table with its compiled kernels, checked on load."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cutlass_tune import BestTable, load_best
from cutlass_tune.compile import CompiledKernel
from cutlass_tune.compile._cache import record_digest
from cutlass_tune.report import _export, write_bundle
from cutlass_tune.runtime import LoadedKernel
from cutlass_tune.space import KernelConfig
from cutlass_tune.status import Status
from cutlass_tune.tables import BundleError, read_bundle

from ..cli_run import cli

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "results" / "sweep-nvidia-h200.sqlite"
BUILT_WITH = {"nvcc": "13.0.88", "cutlass": "4.2.0"}


def run(*args):
    return cli(*args)  # in this process: the commands' output and exit codes, not the interpreter


@pytest.fixture
def frame():
    return load_best(STORE)


def stand_ins(frame, root, fail=None):
    """CompiledKernels for the table's configs, two per unit, each unit a file of its own bytes
    with its digest (enough to write and check a bundle; nothing here loads them)."""
    compiled = []
    for i, (h, text) in enumerate(dict(zip(frame["config_hash"], frame["config"])).items()):
        unit = root / f"unit{i // 2}"
        unit.mkdir(parents=True, exist_ok=True)
        (unit / "kernels.so").write_bytes(f"library of unit {i // 2}".encode())
        record_digest(unit)  # as the cache publishes a unit
        config = KernelConfig.from_dict(json.loads(text))
        bad = h == fail
        compiled.append(CompiledKernel(config=config, key=h, status=Status.COMPILE_ERROR if bad else Status.OK,
                                       library=None if bad else unit / "kernels.so", symbol=f"ct_{h}",
                                       seconds=1.0, cached=True, reason="error: planted" if bad else ""))
    return compiled


def test_a_bundle_holds_the_table_one_copy_per_unit_and_a_manifest_that_checks_them(frame, tmp_path):
    out = tmp_path / "bundle"
    summary = write_bundle(frame, stand_ins(frame, tmp_path / "cache"), out, BUILT_WITH)
    assert (summary.problems, summary.kernels, summary.libraries) == (3, 3, 2)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["built_with"] == BUILT_WITH
    assert manifest["gpus"] == ["NVIDIA H200"]
    assert sorted(manifest["libraries"]) == ["kernels/unit0.so", "kernels/unit1.so"]
    for file, digest in manifest["libraries"].items():
        assert hashlib.sha256((out / file).read_bytes()).hexdigest() == digest
    assert summary.bytes == sum((out / f).stat().st_size for f in manifest["libraries"])
    table, kernels = read_bundle(out)
    assert list(table["kernel"]) == list(frame["kernel"])
    assert list(table["ratio"]) == pytest.approx(list(frame["ratio"]), rel=1e-14)  # JSON keeps 15 digits
    assert {h: (k.library.name, k.symbol) for h, k in kernels.items()} == {
        h: (f"unit{i // 2}.so", f"ct_{h}") for i, h in enumerate(frame["config_hash"])}
    loaded = BestTable.load(out)
    assert loaded.bundled == kernels
    match = loaded.lookup(4096, 4096, 4096)
    assert loaded.bundled[match.row["config_hash"]].library.parent == out / "kernels"
    assert BestTable.load(STORE).bundled == {}  # a store brings no kernels
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "cache"]  # no temporary left


def test_an_existing_directory_is_never_written_into(frame, tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(BundleError, match="exists: remove it or export to a new directory"):
        write_bundle(frame, stand_ins(frame, tmp_path / "cache"), out, BUILT_WITH)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_a_kernel_that_did_not_compile_or_is_missing_writes_nothing(frame, tmp_path):
    failing = frame["config_hash"][1]
    with pytest.raises(BundleError, match=f"{frame['kernel'][1]} does not compile: error: planted"):
        write_bundle(frame, stand_ins(frame, tmp_path / "a", fail=failing), tmp_path / "bundle", BUILT_WITH)
    with pytest.raises(BundleError, match="was not compiled for the bundle"):
        write_bundle(frame, stand_ins(frame, tmp_path / "b")[:2], tmp_path / "bundle", BUILT_WITH)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_an_export_stopped_while_copying_leaves_no_directory(frame, tmp_path, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(_export.shutil, "copyfile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_bundle(frame, stand_ins(frame, tmp_path / "cache"), tmp_path / "bundle", BUILT_WITH)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


@pytest.fixture
def bundle(frame, tmp_path):
    out = tmp_path / "bundle"
    write_bundle(frame, stand_ins(frame, tmp_path / "cache"), out, BUILT_WITH)
    return out


def edit_manifest(bundle, change):
    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_a_library_changed_after_export_is_refused(bundle):
    (bundle / "kernels" / "unit1.so").write_bytes(b"rebuilt elsewhere")
    with pytest.raises(BundleError, match=r"unit1.so differs from the one exported \(its SHA-256"):
        BestTable.load(bundle)


def test_a_missing_library_is_refused(bundle):
    (bundle / "kernels" / "unit0.so").unlink()
    with pytest.raises(BundleError, match="unit0.so is missing from the bundle"):
        load_best(bundle)


def test_an_unreadable_library_is_one_bundle_error(bundle, monkeypatch):
    """Guards `BestTable.load` of a bundle whose .so cannot be read (a PermissionError traceback)."""
    library = bundle / "kernels" / "unit0.so"
    library.chmod(0)
    if os.geteuid() == 0:  # root reads it all the same: the read fails as it would for another user
        from cutlass_tune.tables import _bundle

        def denied(path):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(_bundle, "sha256_of", denied)
    for read in (BestTable.load, load_best):
        with pytest.raises(BundleError, match=r"^cannot read .*unit0.so: Permission denied$"):
            read(bundle)


def test_another_abi_or_format_is_refused(bundle):
    edit_manifest(bundle, lambda m: m.update(abi_version=m["abi_version"] + 1))
    with pytest.raises(BundleError, match="holds kernels of ABI version .*: export the bundle again"):
        BestTable.load(bundle)
    edit_manifest(bundle, lambda m: m.update(abi_version=m["abi_version"] - 1, format=2))
    with pytest.raises(BundleError, match="is a bundle of format 2; this cutlass-tune reads format 1"):
        BestTable.load(bundle)


def test_a_malformed_manifest_is_refused(bundle):
    (bundle / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="manifest.json is not a bundle manifest"):
        BestTable.load(bundle)
    (bundle / "manifest.json").write_text(json.dumps({"format": 1}))
    with pytest.raises(BundleError, match="is not a bundle manifest .*KeyError"):
        BestTable.load(bundle)


def test_a_library_outside_the_bundle_is_refused(bundle, tmp_path):
    def escape(m):
        m["libraries"]["../cache/unit0/kernels.so"] = m["libraries"].pop("kernels/unit0.so")

    edit_manifest(bundle, escape)
    with pytest.raises(BundleError, match="names a library outside the bundle"):
        BestTable.load(bundle)


def test_a_table_row_without_its_kernel_is_refused(bundle, frame):
    gone = frame["config_hash"][0]
    edit_manifest(bundle, lambda m: m["kernels"].pop(gone))
    with pytest.raises(BundleError, match=f"the table's kernel {gone} is not in the bundle"):
        BestTable.load(bundle)


def test_export_errors_are_one_line(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    for args, message in (
        (["--storage", STORE, "-o", taken], f"error: {taken} exists: remove it or export to a new directory\n"),
        (["--storage", tmp_path / "none.sqlite", "-o", tmp_path / "b"], "error: no store at sqlite:///"),
        (["--storage", STORE, "-o", tmp_path / "b", "--gpu-name", "NVIDIA H100"],
         "error: --gpu-name 'NVIDIA H100': the table has no row for it\n"),
    ):
        r = run("export", *args)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith(message), r.stderr
        assert r.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_export_to_a_pipe_says_each_kernel_compiled_and_bundled_with_the_time(tmp_path):
    # Regression: to a pipe (a log, a batch job) export printed nothing for the 107 s its compiles took.
    env = {**os.environ, "CUTLASS_TUNE_NVCC": str(REPO / "tests/compile/fake_nvcc.py")}
    names = sorted(set(load_best(STORE)["kernel"]))
    for out, done in ((tmp_path / "b1", "built in \\d+ s"), (tmp_path / "b2", "cached")):
        r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "export", "--storage", STORE, "-o", out,
                            "--cache-dir", tmp_path / "cache"], capture_output=True, text=True, cwd=REPO, env=env)
        assert r.returncode == 0 and r.stdout.startswith(f"exported 3 problems, {len(names)} kernels"), r.stderr
        lines, n = r.stderr.splitlines(), len(names)
        stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
        # Regression: nothing was printed before the first compile ended (94 s with nvcc).
        assert re.fullmatch(f"{stamp}compiling 0/{n}: nvcc on \\S+.*", lines.pop(0)), r.stderr
        compiled = [re.fullmatch(f"{stamp}compiling (\\d+)/{n}: (\\S+) {done}", line) for line in lines[:n]]
        bundled = [re.fullmatch(f"{stamp}bundling (\\d+)/{n}: (\\S+)", line) for line in lines[n:]]
        assert all(compiled) and all(bundled) and len(lines) == 2 * n, r.stderr
        for matches in (compiled, bundled):
            assert [m[1] for m in matches] == [str(i + 1) for i in range(len(names))]
            assert sorted(m[2] for m in matches) == names


@pytest.mark.nvcc
def test_export_builds_the_winners_and_they_load_from_the_bundle_alone(tmp_path):
    out = tmp_path / "bundle"
    r = run("export", "--storage", STORE, "-o", out, "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("exported 3 problems, 3 kernels in ") and str(out) in r.stdout
    shutil.rmtree(tmp_path / "cache")  # the bundle needs no cache and no compiler
    table = BestTable.load(out)
    for row in table.frame.itertuples():
        kernel = table.bundled[row.config_hash]
        loaded = LoadedKernel(kernel.library, kernel.symbol)
        assert loaded.stages() >= 2
        assert loaded.mma_n() == min(row.tile_n, 256)
    shown = run("best", "--storage", out)
    assert shown.returncode == 0 and "4096x4096x4096_bf16bf16bf16_tn" in shown.stdout
