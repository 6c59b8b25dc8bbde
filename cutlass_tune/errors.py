"""Exception classes. Each names what the user should fix; the CLI prints them on one line."""


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
