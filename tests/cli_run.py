"""The command line run inside the test's process, as `python -m cutlass_tune.cli ARGS` runs it in
its own: the same `main` (exit codes, one-line errors), stdout and stderr captured, the working
directory the repository's. A subprocess pays a second or more of imports per command; tests
about the process itself (signals, a console script, what a fresh interpreter imports) start one.
"""

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _fresh_warning_filters() -> None:
    """The warning filters of a fresh interpreter (pytest's own record warnings instead of
    printing them), each warning shown once per place as there."""
    warnings.resetwarnings()
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category, append=True)


def cli(*args: object, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`cutlass-tune ARGS` in this process: its exit code, stdout and stderr, as `subprocess.run`
    with `capture_output=True, text=True` gives them (an uncaught exception: code 1 and its
    traceback on stderr, as the interpreter prints it)."""
    from cutlass_tune.cli import main

    argv = ["cutlass-tune", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}  # main installs its own
    root = logging.getLogger()
    kept = (root.handlers[:], root.level)  # main's logging.basicConfig(force=True) replaces them
    here = os.getcwd()
    code = 0
    try:
        os.chdir(cwd)
        with mock.patch.object(sys, "argv", argv), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            _fresh_warning_filters()
            try:
                main()
            except SystemExit as e:
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            except Exception:
                traceback.print_exc()
                code = 1
            finally:
                logging.captureWarnings(False)  # main's captureWarnings(True) is taken once per process
    finally:
        os.chdir(here)
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)
        root.handlers[:] = kept[0]
        root.setLevel(kept[1])
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
