from ..compile.conftest import cache, fake_toolchain, nvcc_calls  # noqa: F401 (the compile stage's fixtures)
