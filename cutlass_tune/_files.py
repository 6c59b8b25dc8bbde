"""Checks on files the tool is asked to make, shared by the commands and the store."""

from __future__ import annotations

import os
from pathlib import Path


def why_unwritable(path: Path) -> str | None:
    """Why the file `path` could not be made, or None: its nearest existing ancestor is a file,
    or a folder this process may not write in."""
    ancestor = path.parent.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"no permission to write in {ancestor}"
    return None
