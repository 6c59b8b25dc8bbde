#!/usr/bin/env python3
"""Stands in for nvcc in tests: writes the output file, or fails or hangs on request.

FAKE_NVCC_FAIL_IF / FAKE_NVCC_HANG_IF: a substring of the source that triggers a failure or a
hang; FAKE_NVCC_FAIL_MESSAGE: the text of that failure's error line; FAKE_NVCC_KILL_IF: one
that kills it with SIGKILL (as the OOM killer does);
FAKE_NVCC_DISK_FULL_IF: one that fails writing its output (ENOSPC); FAKE_NVCC_SLEEP: seconds
each compile takes; FAKE_NVCC_LOG_DIR: one file per call; FAKE_NVCC_PID_DIR: a file named by
the pid of each call, made before it sleeps.
"""
import os
import sys
import time
import uuid

args = sys.argv[1:]
if "--version" in args:
    print("Cuda compilation tools, release 99.0, V99.0.1")
    sys.exit(0)
out = args[args.index("-o") + 1]
source = open(args[-1]).read()
if os.environ.get("FAKE_NVCC_LOG_DIR"):
    with open(os.path.join(os.environ["FAKE_NVCC_LOG_DIR"], uuid.uuid4().hex), "w") as f:
        f.write(source)
if os.environ.get("FAKE_NVCC_PID_DIR"):
    open(os.path.join(os.environ["FAKE_NVCC_PID_DIR"], str(os.getpid())), "w").close()
time.sleep(float(os.environ.get("FAKE_NVCC_SLEEP", "0")))
kill = os.environ.get("FAKE_NVCC_KILL_IF")
if kill and kill in source:
    os.kill(os.getpid(), 9)
full = os.environ.get("FAKE_NVCC_DISK_FULL_IF")
if full and full in source:
    print(f"nvlink fatal   : Could not write {out}: No space left on device")
    sys.exit(1)
hang = os.environ.get("FAKE_NVCC_HANG_IF")
if hang and hang in source:
    time.sleep(3600)
fail = os.environ.get("FAKE_NVCC_FAIL_IF")
if fail and fail in source:
    message = os.environ.get("FAKE_NVCC_FAIL_MESSAGE", 'static assertion failed with "planted failure"')
    print(f"{args[-1]}(12): error: {message}")
    sys.exit(1)
print("ptxas info    : Compiling entry function '_ZN19ct_0000000000000000_kernel'")
print("ptxas info    : Function properties for _ZN19ct_0000000000000000_kernel")
print("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
with open(out, "w") as f:
    f.write("fake shared object\n")
