"""Rendered sources stay byte-identical for configs of every kind of operation: the kernel cache
key hashes the source, so a changed byte rebuilds every cached kernel and leaves published
bundles' keys behind. tests/data/render_hashes.json holds a sample of configs of each kind and
their units' keys as rendered before the render builders went behind the kinds' registry
(written by `python3 -m tests.render_hashes`)."""

import json
from pathlib import Path

import pytest

from cutlass_tune.render import render_unit
from cutlass_tune.space import KernelConfig

_DATA = json.loads((Path(__file__).parent / "data" / "render_hashes.json").read_text())
KINDS = ("dense bf16", "fp8 rowcol", "blockwise", "blockwise swap", "grouped bf16", "grouped fp8 blockwise")


def test_the_sample_holds_every_kind():
    assert set(KINDS) <= set(_DATA)
    assert all(len(_DATA[kind]) >= 10 for kind in KINDS)


@pytest.mark.parametrize("kind", sorted(_DATA))
def test_rendered_sources_are_unchanged(kind):
    changed = []
    for unit in _DATA[kind]:
        configs = [KernelConfig.from_dict(c) for c in unit["configs"]]
        if render_unit(configs).key != unit["key"]:
            changed.append(configs[0].name)
    assert not changed, f"{kind}: {len(changed)} units render differently, e.g. {changed[0]}"
