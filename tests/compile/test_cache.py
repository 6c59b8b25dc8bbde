import shutil

import pytest

from cutlass_tune.compile import CompiledKernel, compile_kernels
from cutlass_tune.compile._cache import record_digest
from cutlass_tune.kernel._abi import VERSION_SYMBOL
from cutlass_tune.render import kernel_symbol
from cutlass_tune.space import KernelConfig
from cutlass_tune.status import Status

from .fake_nvcc import elf_library

CFG = KernelConfig()


def build(cache, toolchain):
    return compile_kernels([CFG], cache=cache, toolchain=toolchain, jobs=1)[0]


def test_entry_whose_unit_is_gone_is_rebuilt(fake_toolchain, cache, nvcc_calls):
    first = build(cache, fake_toolchain)
    shutil.rmtree(first.library.parent)
    assert cache.lookup(first.key, CFG) is None
    again = build(cache, fake_toolchain)
    assert again.status is Status.OK and not again.cached and again.library.exists()
    assert len(nvcc_calls()) == 2


def test_entry_whose_library_is_gone_is_rebuilt(fake_toolchain, cache, nvcc_calls):
    # Guards against: a rebuilt kernel reported OK with a library path that does not exist.
    first = build(cache, fake_toolchain)
    first.library.unlink()
    assert cache.lookup(first.key, CFG) is None
    again = build(cache, fake_toolchain)
    assert again.status is Status.OK and again.library.exists()
    assert cache.lookup(first.key, CFG) is not None


@pytest.mark.parametrize("damage", [
    lambda text: text[: len(text) // 2].encode(),  # truncated by a crash
    lambda text: b"",
    lambda text: b"\xff\x00garbage",
])
def test_corrupt_entry_is_a_miss_and_rebuilt(fake_toolchain, cache, nvcc_calls, damage):
    first = build(cache, fake_toolchain)
    entry = cache._entry_path(first.key)
    entry.write_bytes(damage(entry.read_text()))
    assert cache.lookup(first.key, CFG) is None
    again = build(cache, fake_toolchain)
    assert again.status is Status.OK and not again.cached and again.library.exists()
    assert len(nvcc_calls()) == 2
    assert cache.lookup(first.key, CFG).library == again.library  # the entry was rewritten


@pytest.mark.parametrize("text", ["{}", "null", '{"status": "bogus", "unit": "u", "symbol": "s", "seconds": 1}'])
def test_entry_of_the_wrong_shape_is_a_miss(fake_toolchain, cache, text):
    # Guards against: one damaged entry file stopping every compile that includes its kernel.
    first = build(cache, fake_toolchain)
    cache._entry_path(first.key).write_text(text)
    assert cache.lookup(first.key, CFG) is None


def test_publish_onto_a_published_unit_keeps_it(cache):
    ours = cache.new_build_dir()
    (ours / "kernels.so").write_bytes(elf_library((VERSION_SYMBOL, "ours")))
    theirs = cache.unit_dir("cd" * 32)
    theirs.mkdir()
    (theirs / "kernels.so").write_bytes(elf_library((VERSION_SYMBOL, "theirs")))
    record_digest(theirs)  # published whole by another process
    result = CompiledKernel(config=CFG, key="ab" * 32, status=Status.OK, library=None,
                            symbol=kernel_symbol(CFG), seconds=1.0, cached=False)
    [published] = cache.publish(ours, "cd" * 32, [result])
    assert not ours.exists()
    assert published.library == theirs / "kernels.so" and b"theirs" in published.library.read_bytes()
    assert cache.lookup(result.key, CFG).library == published.library
    assert not list((cache.root / "tmp").iterdir())
    assert [p.name for p in (cache.root / "kernels").rglob("*")] == ["ab", f"{result.key}.json"]


def test_cached_compile_failure_is_not_retried(fake_toolchain, cache, nvcc_calls, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_FAIL_IF", f"namespace {kernel_symbol(CFG)} {{")
    first = build(cache, fake_toolchain)
    assert first.status is Status.COMPILE_ERROR and "planted failure" in first.reason
    monkeypatch.delenv("FAKE_NVCC_FAIL_IF")  # a retry would now succeed
    again = build(cache, fake_toolchain)
    assert again.status is Status.COMPILE_ERROR and again.cached
    assert again.reason == first.reason and "planted failure" in again.log_path.read_text()
    assert len(nvcc_calls()) == 1
