#!/usr/bin/env python3
"""Stands in for nvcc in tests: writes the output library, or fails or hangs on request.

The library is a minimal ELF shared object exporting the ABI version function (`elf_library`),
so it passes the checks a real build must pass. Like nvcc, it fails when TMPDIR is not a folder,
and, with FAKE_NVCC_HOST_CHECK set, when no gcc is on PATH (the messages are real nvcc's).

FAKE_NVCC_FAIL_IF / FAKE_NVCC_HANG_IF: a substring of the source that triggers a failure or a
hang; FAKE_NVCC_FAIL_MESSAGE: the text of that failure's error line; FAKE_NVCC_KILL_IF: one
that kills it with SIGKILL (as the OOM killer does);
FAKE_NVCC_DISK_FULL_IF: one that fails writing its output (ENOSPC); FAKE_NVCC_GARBAGE_IF /
FAKE_NVCC_NO_ABI_IF: one that makes it exit 0 after writing an 11-byte non-ELF file / an ELF
library without the ABI version function; FAKE_NVCC_SAY_IF with FAKE_NVCC_SAY: one that makes it
print FAKE_NVCC_SAY and exit 1; FAKE_NVCC_STAGE: run a child stage (as cicc) that sleeps
FAKE_NVCC_SLEEP seconds instead of sleeping itself; FAKE_NVCC_SLEEP: seconds each compile
takes; FAKE_NVCC_LOG_DIR: one file per call; FAKE_NVCC_PID_DIR: a file named by the pid of each
call (and "stage-<pid>" for a child stage), made before it sleeps.
"""
import os
import shutil
import struct
import subprocess
import sys
import time
import uuid

VERSION_SYMBOL = "cutlass_tune_abi_version"


def elf_library(functions=(VERSION_SYMBOL,)) -> bytes:
    """A 64-bit ELF shared object whose dynamic symbol table exports `functions` (not loadable:
    it has no program headers; only read, never loaded, by the code under test)."""
    dynstr = b"\0" + b"".join(f.encode() + b"\0" for f in functions)
    symbols = [b"\0" * 24]
    at = 1
    for f in functions:
        symbols.append(struct.pack("<IBBHQQ", at, (1 << 4) | 2, 0, 3, 0x1000, 8))
        at += len(f) + 1
    dynsym = b"".join(symbols)
    text = b"\xc3" * 8
    shstrtab = b"\0.dynstr\0.dynsym\0.text\0.shstrtab\0"
    body = [dynstr, dynsym, text, shstrtab]
    offsets, offset = [], 64
    for part in body:
        offsets.append(offset)
        offset += len(part)
    section_offset = (offset + 7) // 8 * 8
    header = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, section_offset, 0, 64, 0, 0, 64, 5, 4)
    sections = [b"\0" * 64]
    names = {".dynstr": 1, ".dynsym": 9, ".text": 17, ".shstrtab": 23}
    layout = [(".dynstr", 3, 0, 0), (".dynsym", 11, 1, 24), (".text", 1, 0, 0), (".shstrtab", 3, 0, 0)]
    for (name, kind, link, entry), part, at in zip(layout, body, offsets):
        sections.append(struct.pack("<IIQQQQIIQQ", names[name], kind, 0, 0, at, len(part), link,
                                    1 if kind == 11 else 0, 8, entry))
    blob = header + b"".join(body)
    return blob + b"\0" * (section_offset - len(blob)) + b"".join(sections)


def _triggered(variable: str, source: str) -> bool:
    value = os.environ.get(variable)
    return bool(value) and value in source


def main() -> None:
    args = sys.argv[1:]
    if "--version" in args:
        print("Cuda compilation tools, release 99.0, V99.0.1")
        sys.exit(0)
    out = args[args.index("-o") + 1]
    source = open(args[-1]).read()
    if os.environ.get("FAKE_NVCC_LOG_DIR"):
        with open(os.path.join(os.environ["FAKE_NVCC_LOG_DIR"], uuid.uuid4().hex), "w") as f:
            f.write(source)
    pid_dir = os.environ.get("FAKE_NVCC_PID_DIR")
    if pid_dir:
        open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    if os.environ.get("FAKE_NVCC_HOST_CHECK") and shutil.which("gcc") is None:
        print("gcc: No such file or directory\nnvcc fatal   : Failed to preprocess host compiler properties.")
        sys.exit(1)
    tmp = os.environ.get("TMPDIR")
    if tmp and not os.path.isdir(tmp):
        print(f"nvcc fatal   : Could not open output file '{tmp}/tmpxft_00002952_0000000a'")
        sys.exit(1)
    sleep = float(os.environ.get("FAKE_NVCC_SLEEP", "0"))
    if os.environ.get("FAKE_NVCC_STAGE"):
        stage = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({sleep})"])
        if pid_dir:
            open(os.path.join(pid_dir, f"stage-{stage.pid}"), "w").close()
        stage.wait()
    else:
        time.sleep(sleep)
    if _triggered("FAKE_NVCC_KILL_IF", source):
        os.kill(os.getpid(), 9)
    if _triggered("FAKE_NVCC_DISK_FULL_IF", source):
        print(f"nvlink fatal   : Could not write {out}: No space left on device")
        sys.exit(1)
    if _triggered("FAKE_NVCC_SAY_IF", source):
        print(os.environ["FAKE_NVCC_SAY"])
        sys.exit(1)
    if _triggered("FAKE_NVCC_HANG_IF", source):
        time.sleep(3600)
    if _triggered("FAKE_NVCC_FAIL_IF", source):
        message = os.environ.get("FAKE_NVCC_FAIL_MESSAGE", 'static assertion failed with "planted failure"')
        print(f"{args[-1]}(12): error: {message}")
        sys.exit(1)
    print("ptxas info    : Compiling entry function '_ZN19ct_0000000000000000_kernel'")
    print("ptxas info    : Function properties for _ZN19ct_0000000000000000_kernel")
    print("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
    if _triggered("FAKE_NVCC_GARBAGE_IF", source):
        content = b"not an elf\n"
    elif _triggered("FAKE_NVCC_NO_ABI_IF", source):
        content = elf_library(("something_else",))
    else:
        content = elf_library()
    with open(out, "wb") as f:
        f.write(content)


if __name__ == "__main__":
    main()
