# The kernels the loader tests load are those the bench tests build (a cache hit when both run).
from ..bench.conftest import cooperative_kernel, faulty_library  # noqa: F401
