"""The C side of the kernel ABI, cut from the template, for tests that build against it."""

import subprocess
from pathlib import Path

from cutlass_tune import settings
from cutlass_tune.kernel import ABI_VERSION

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "templates" / "gemm_sm90_unit.cu.j2"
DATA = Path(__file__).with_name("data")


def header_text() -> str:
    """`struct cutlass_tune_args` and CUTLASS_TUNE_ABI exactly as compiled kernels see them."""
    text = TEMPLATE.read_text()
    start = text.index("#ifndef CUTLASS_TUNE_ARGS_DEFINED")
    end = text.index("#endif", start) + len("#endif")
    return "#include <cstdint>\n" + text[start:end].replace("{{ abi_version }}", str(ABI_VERSION)) + "\n"


def build_faulty(out_dir: Path) -> Path:
    """Compile data/faulty.cu (ct_fault, ct_hang, ct_corrupt) into out_dir/faulty.so."""
    (out_dir / "cutlass_tune_args.h").write_text(header_text())
    library = out_dir / "faulty.so"
    cmd = [settings.nvcc_path(), "-gencode=arch=compute_90,code=[sm_90,compute_90]", "-O2",
           "-std=c++17", "-Xcompiler=-fPIC", "-shared", f"-I{out_dir}", "-o", str(library),
           str(DATA / "faulty.cu")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return library
