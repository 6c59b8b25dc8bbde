"""`load_candidates`: a store's leading kernel variants per problem, the first `load_best`'s row."""

import gzip
import shutil
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune.report import load_best, load_candidates
from cutlass_tune.tables import BestTableError

REPO = Path(__file__).resolve().parents[2]
SWEPT = REPO / "results" / "sweep-nvidia-h200.sqlite"  # sweep passes only
MOE = REPO / "benchmarks" / "results" / "session_20261127c" / "h200_moe_suite" / "moe-suite.sqlite.gz"  # confirmed


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "moe.sqlite"
    with gzip.open(MOE) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


@pytest.mark.parametrize("store", ["moe", "swept"])
def test_the_first_candidate_is_the_best_tables_row(request, store):
    source = request.getfixturevalue("moe") if store == "moe" else SWEPT
    best = load_best(source)
    pd.testing.assert_frame_equal(load_candidates(source, 1), best)
    first = load_candidates(source, 3).groupby("problem", sort=False).head(1)
    pd.testing.assert_frame_equal(first.reset_index(drop=True), best)


def test_confirmed_candidates_rank_by_their_median_confirmed_ratio(moe):
    found = load_candidates(moe, 3)
    for _, group in found.groupby("problem", sort=False):
        assert 1 <= len(group) <= 3
        assert (group["confirm_passes"] > 0).all()
        assert list(group["strongest_ratio"]) == sorted(group["strongest_ratio"], reverse=True)
        assert not group.duplicated(["config_hash", "runtime"]).any()
    assert (found.groupby("problem").size() > 1).any()  # the store holds runners-up to time


def test_unconfirmed_candidates_are_the_sweeps_distinct_variants_best_first():
    found = load_candidates(SWEPT, 3)
    for _, group in found.groupby("problem", sort=False):
        assert len(group) == 3 and (group["confirm_passes"] == 0).all()
        assert list(group["strongest_ratio"]) == sorted(group["strongest_ratio"], reverse=True)
        assert not group.duplicated(["config_hash", "runtime"]).any()


def test_a_table_file_is_no_source_of_candidates(tmp_path):
    with pytest.raises(BestTableError, match="the candidates come from a store"):
        load_candidates(REPO / "tests" / "report" / "data" / "best-v2.csv", 3)
