"""A table is checked against the GPU it runs on: rows tuned on another GPU model are not used
(torch computes, and a warning names both GPUs once); rows of this model, or naming none, are."""

import warnings

import pandas as pd
import pytest
import torch
from torch import nn

import cutlass_tune
from cutlass_tune.runtime import BestTable, _dispatch
from cutlass_tune.tables import BestTableError

from .tables import csv_table

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


@pytest.fixture
def on_gpu(monkeypatch):
    """Pretend CUDA device names: set `names[index]`."""
    names: dict[int, str] = {}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: names[device])
    monkeypatch.setattr(_dispatch, "_warned", set())
    return names


@pytest.fixture
def h200_table(tmp_path):
    """bf16 tn 128x64x32, tuned on an H200 (the template row's GPU)."""
    return csv_table(tmp_path / "best.csv", [("bf16", "tn", 128, 64, 32)])


def test_an_h200_table_is_not_used_on_an_h100_and_a_warning_names_both(on_gpu, h200_table):
    on_gpu[0] = H100
    with pytest.warns(RuntimeWarning, match=f"tuned on {H200}, not on this GPU \\(cuda:0, {H100}\\)"):
        rows = _dispatch.device_table(h200_table, 0, "matmul")
    assert rows.frame.empty
    with pytest.raises(BestTableError):
        rows.lookup(128, 64, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per table and device
        assert _dispatch.device_table(h200_table, 0, "matmul") is rows


def test_rows_of_this_gpu_and_rows_naming_none_are_used(on_gpu, h200_table):
    on_gpu[0], on_gpu[1] = H200, H100
    mixed = BestTable(pd.concat([h200_table.frame, h200_table.frame.assign(gpu=H100, m=4096)], ignore_index=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a table with rows of this GPU warns of nothing
        assert list(_dispatch.device_table(mixed, 0, "matmul").frame["m"]) == [128]
        assert list(_dispatch.device_table(mixed, 1, "matmul").frame["m"]) == [4096]
        unnamed = BestTable(h200_table.frame.assign(gpu=""))
        assert len(_dispatch.device_table(unnamed, 0, "matmul").frame) == 1


def test_patch_leaves_the_layers_of_a_gpu_the_table_was_not_tuned_on(on_gpu, h200_table, monkeypatch):
    on_gpu[0] = H100
    model = nn.Sequential(nn.Linear(32, 64, bias=False, dtype=torch.bfloat16))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)  # the weight "on cuda:0"
    with pytest.warns(RuntimeWarning, match=f"cutlass_tune.patch: the table was tuned on {H200}"):
        report = cutlass_tune.patch(model, h200_table, cuda_only=False)
    assert not report.layers[0].swapped
    assert report.layers[0].reason.startswith("the table has no bf16 tn entries")
