"""Outcomes of compiling and measuring a kernel. Expected failures are values, not exceptions."""

import enum


class Status(str, enum.Enum):
    OK = "ok"
    INVALID = "invalid"  # rejected by the space rules; never compiled
    COMPILE_ERROR = "compile_error"
    CANNOT_IMPLEMENT = "cannot_implement"
    WRONG_RESULT = "wrong_result"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    UNSTABLE = "unstable"  # verified, but its timing stayed too noisy to rank (host load, see bench)
    COARSE = "coarse"  # verified and timed briefly in a race it lost (bench/_race.py): guides the search, never ranks


TIMED = (Status.OK, Status.UNSTABLE, Status.COARSE)
"""Outcomes that carry timing figures."""
