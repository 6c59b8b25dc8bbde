"""benchmarks/regimes_summary.py: every problem the patterns name gets a line, with its regimes'
figures and its failed confirm measurements named with their reasons."""

import importlib.util
from pathlib import Path

import pandas as pd

from cutlass_tune.status import Status
from cutlass_tune.store import CONFIRM_STUDY, StoredRow

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "regimes_summary.py"
DECODE, DOWN, OTHER = "2048x3072x4096_grouped_e128", "49152x2048x1408_grouped_e64", "1024x1024x1024_tn"
HOST = "RuntimeError: timing in regime interleaved:64MiB: the host never got ahead of the GPU on side 1 of 3"


def _module():
    spec = importlib.util.spec_from_file_location("regimes_summary", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _best_row(problem, sweep, **regimes):
    row = {"problem": problem, "sweep_ratio": sweep}
    for column in ("sustained", "idle_gap", "interleaved", "as_captured"):
        name, ratio, mhz, watts = regimes.get(column, ("", float("nan"), float("nan"), float("nan")))
        row.update({f"{column}_regime": name, f"{column}_ratio": ratio, f"{column}_sm_mhz": mhz,
                    f"{column}_power_w": watts})
    return row


def test_a_problem_with_a_failed_side_or_no_regime_figures_is_printed_with_its_failure_named():
    """Guards against the summary printing two of the MoE store's four problems: it listed only
    rows with a regime's figures, and a failure's reason not at all."""
    best = [_best_row(DECODE, 1.368, sustained=("sustained", 1.356, 1980.0, 714.0),
                      interleaved=("interleaved:64MiB", 1.358, 1980.0, 673.0)),
            _best_row(DOWN, 1.163), _best_row(OTHER, 1.01)]
    rows = [StoredRow(id=i, problem=DECODE, kernel="torch._grouped_mm", runtime="baseline", status=Status.RUNTIME_ERROR,
                      reason=HOST + "\ntraceback", regime="interleaved:64MiB", study=CONFIRM_STUDY) for i in (1, 2)]
    rows += [StoredRow(id=3, problem=DECODE, kernel="k", status=Status.COMPILE_ERROR, reason="nvcc", regime="sustained",
                       study="sweep-study"),  # a sweep's failure is not the confirm's
             StoredRow(id=4, problem=DECODE, kernel="k", status=Status.OK, regime="interleaved:64MiB",
                       study=CONFIRM_STUDY)]
    lines = _module().summary(best, rows, ["2048x*", "49152x*"])
    assert lines == [
        f"{DECODE} sweep 1.368 sustained 1.356 1980 MHz 714 W; interleaved:64MiB 1.358 1980 MHz 673 W; "
        f"interleaved:64MiB FAILED torch._grouped_mm runtime_error x2: {HOST}",
        f"{DOWN} sweep 1.163 no regime figures and no failure in the store"]


def test_the_script_reads_a_best_csv_and_a_store(tmp_path, capsys):
    from cutlass_tune.store import ResultStore

    pd.DataFrame([_best_row(OTHER, 1.01, idle_gap=("idle-gap:1000us", 0.98, 1980.0, 400.0))]).to_csv(
        tmp_path / "best.csv", index=False)
    from cutlass_tune.measurement import Measurement
    from cutlass_tune.space import Problem, RuntimeArgs

    store = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    store.bind_gpu("Fake GPU")
    store.add(Measurement(problem=Problem(1024, 1024, 1024), config=None, runtime=RuntimeArgs(), status=Status.OK,
                          is_baseline=True, tflops=600.0, median_ms=0.004, samples=10), gpu="Fake GPU", run_id="r",
              study=CONFIRM_STUDY)
    _module().main([str(tmp_path / "best.csv"), str(tmp_path / "store.sqlite")])
    assert capsys.readouterr().out == f"{OTHER} sweep 1.010 idle-gap:1000us 0.980 1980 MHz 400 W\n"
