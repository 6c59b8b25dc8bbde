"""`check`'s rule on the CPU: the call-site ratio of an entry, its flag against the table's claim,
and the table that records it for the dispatcher."""

import math
import subprocess
import sys
import warnings

import pytest

from cutlass_tune.bench._check import GAP, Delivered, EntryCheck
from cutlass_tune.bench._timing import TimingStats
from cutlass_tune.runtime import BestTable, FallbackReason, resolve
from cutlass_tune.space import Problem
from cutlass_tune.tables import with_call_site

from ..runtime.tables import csv_table
from ..runtime.test_dispatch import call, gpu  # noqa: F401 - the fixture


def _stats(ms):
    return TimingStats(median_ms=ms, p20_ms=ms, p80_ms=ms, samples=10, sm_mhz=1980.0, power_w=580.0)


def _entry(claimed, *ratios, regime="sustained"):
    modes = ("loop", "graph") if regime == "sustained" else (regime,)
    delivered = tuple(Delivered(mode, _stats(1.0), _stats(r)) for mode, r in zip(modes, ratios))
    return EntryCheck(Problem(128, 64, 32), "k", claimed, delivered, regime=regime)


@pytest.mark.parametrize(("claimed", "ratios", "flagged"), [
    (1.01, (0.97, 1.00), True),     # 4% below in loop mode
    (1.01, (0.995, 1.0), False),    # within 2%
    (1.20, (1.10,), True),          # the MoE rows with idle gaps: faster than torch, yet 8% below the claim
    (None, (0.5, 0.5), False),      # nothing claimed, nothing to fall below
])
def test_an_entry_more_than_two_percent_below_its_claim_is_flagged(claimed, ratios, flagged):
    entry = _entry(claimed, *ratios, regime="sustained" if len(ratios) == 2 else "idle-gap:200us")
    assert GAP == 0.02
    assert entry.flagged is flagged
    assert entry.call_site_ratio == pytest.approx(min(ratios))
    line = entry.to_dict()
    assert line["regime"] == entry.regime and line["flagged"] is flagged
    assert line["call_site_ratio"] == pytest.approx(min(ratios))
    assert all(d["sm_mhz"] == 1980.0 and d["power_w"] == 580.0 for d in line["delivered"].values())


def test_an_entry_not_measured_has_no_call_site_ratio():
    entry = EntryCheck(Problem(128, 64, 32), "k", 1.0, error="a grouped entry")
    assert entry.call_site_ratio is None and not entry.flagged


def test_the_recorded_call_site_ratio_keeps_a_flagged_entry_off(gpu, tmp_path):  # noqa: F811
    """Guards against a flagged entry still running under min_ratio 1.0 once `check --table-out`
    has recorded what it delivers (claim 1.01, call site 0.97)."""
    table = csv_table(tmp_path / "best.csv", [("bf16", "tn", 128, 64, 32)])
    table.frame["ratio"] = 1.01
    entry = _entry(1.01, 0.97, 0.99)
    assert entry.flagged
    frame = with_call_site(table.frame, {entry.problem.name: (entry.call_site_ratio, entry.regime)})
    assert frame["call_site_ratio"].tolist() == pytest.approx([0.97]) and frame["call_site_regime"].tolist() == [
        "sustained"]
    checked = BestTable(frame, bundled=table.bundled)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = resolve(checked, call())
    assert plan.fallback is not None and plan.fallback.reason is FallbackReason.BELOW_MIN_RATIO
    assert "at the call site (sustained) (its claim 1.010)" in str(caught[0].message)


def test_rows_of_problems_not_checked_keep_their_cells(tmp_path):
    table = csv_table(tmp_path / "best.csv", [("bf16", "tn", 128, 64, 32), ("bf16", "tn", 256, 64, 32)])
    first = table.frame["problem"][0]
    frame = with_call_site(table.frame, {first: (1.03, "idle-gap:200us")})
    assert frame["call_site_ratio"][0] == pytest.approx(1.03) and math.isnan(frame["call_site_ratio"][1])
    assert frame["call_site_regime"].tolist() == ["idle-gap:200us", ""]


@pytest.mark.parametrize(("args", "said"), [
    (["--regime", "busy"], "unknown regime 'busy'"),
    (["--regime", "in-model:eager"], "regime in-model:eager: the bench cannot time a model's step"),
    (["--table-out", "{tmp}/t.txt"], "expected a .csv, .json or .parquet file"),
])
def test_check_refuses_a_bad_regime_or_table_out_in_one_line(tmp_path, args, said):
    csv_table(tmp_path / "best.csv", [("bf16", "tn", 128, 64, 32)])
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "check", str(tmp_path / "best.csv"),
                           *(a.format(tmp=tmp_path) for a in args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1
