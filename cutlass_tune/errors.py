"""Exception classes. Each names what the user should fix; the CLI prints them on one line."""

import re

# C0 but newline and tab, DEL, C1 (ESC starts every ANSI/OSC sequence; C1 0x9b and 0x9d are
# one-character CSI and OSC), and the bidirectional overrides that reorder what a line shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object) -> str:
    """`text` as a string whose control characters are shown as escapes (ESC as the four
    characters `\\x1b`): what is left cannot move the cursor, set a title, make a link or ring.
    Every message that carries text from a file (a store's row, a file name) and may reach a
    terminal by a path other than the CLI's consoles (a warning, a log line) passes through it."""
    return _CONTROL.sub(_escaped, str(text))


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (a SQLAlchemy error's driver message; the
    class name where there is none)."""
    lines = str(getattr(err, "orig", None) or err).strip().splitlines()
    return lines[0].strip() if lines else type(err).__name__


class CutlassTuneError(Exception):
    """Base class of the errors the CLI reports as one line with exit code 2."""


class ConfigFileError(CutlassTuneError):
    """A search-space file is malformed or names an unknown key or value."""

    def __init__(self, path: object, key: str, value: object, problem: str):
        self.path, self.key, self.value, self.problem = path, key, value, problem
        where = f"{path}: {key}" if key else f"{path}"
        shown = f" = {value!r}" if value is not None else ""
        super().__init__(f"{where}{shown}: {problem}")


class RenderError(CutlassTuneError):
    """A config cannot be rendered (invalid, or carries a value outside its enum)."""


class ToolchainError(CutlassTuneError):
    """nvcc or the CUTLASS headers cannot be found or used."""


class GpuUnusableError(CutlassTuneError):
    """A GPU can measure no more: its worker could not start, or start again after losing a
    child. The bench stage raises it (as `WorkerStartError`); a sweep on several GPUs retires
    that one and goes on with the others."""
