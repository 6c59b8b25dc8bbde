"""Child processes released at one instant, to race on a store. Each child script touches
`<me>.ready` once set up, then waits for a file `go` beside it."""

import subprocess
import time
from pathlib import Path


def wait_for_files(folder: Path, pattern: str, n: int, deadline: float) -> None:
    """Until `folder` holds `n` files matching `pattern`, or `time.monotonic()` passes `deadline`."""
    while len(list(folder.glob(pattern))) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def start_together(commands: list[list[str]], folder: Path, cwd: Path | None = None,
                   timeout_s: float = 120) -> list[subprocess.Popen]:
    """Start `commands` (stderr captured), wait until every one is ready, and release them."""
    racers = [subprocess.Popen(c, cwd=cwd, stderr=subprocess.PIPE, text=True) for c in commands]
    wait_for_files(folder, "*.ready", len(racers), time.monotonic() + timeout_s)
    (folder / "go").touch()
    return racers
