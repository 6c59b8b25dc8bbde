"""Checks a built library without loading it: loading runs its constructors, so a file that
is not what nvcc builds (a broken or impostor compiler's output, a file planted in a shared
cache) must be refused before any `dlopen`.

Reads the ELF header, the section table and the dynamic symbol table, with every offset
checked against the file's size.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from ._abi import VERSION_SYMBOL

_SHT_DYNSYM = 11
_STB_GLOBAL, _STB_WEAK = 1, 2
_STT_FUNC = 2
_MAX_SYMBOLS = 10_000_000


def _read(f: BinaryIO, offset: int, size: int, file_size: int, what: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ValueError(f"its {what} lies outside the file (truncated?)")
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError(f"its {what} cannot be read")
    return data


def exported_functions(path: Path) -> set[str]:
    """Names of the functions `path` exports (its defined global or weak FUNC dynamic symbols).

    Raises:
        ValueError: not a whole 64-bit little-endian ELF shared object (the message says why).
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if _read(f, 0, min(size, 4), size, "ELF magic") != b"\x7fELF":
            raise ValueError("it is not an ELF file")
        header = _read(f, 0, 64, size, "ELF header")
        if header[4:6] != b"\x02\x01":
            raise ValueError("it is not a 64-bit little-endian ELF file")
        (elf_type,) = struct.unpack_from("<H", header, 0x10)
        if elf_type != 3:
            raise ValueError("it is not a shared object (ELF type DYN)")
        (section_offset,) = struct.unpack_from("<Q", header, 0x28)
        entry_size, count = struct.unpack_from("<HH", header, 0x3A)
        if entry_size != 64 or count == 0:
            raise ValueError("it has no section table")
        table = _read(f, section_offset, entry_size * count, size, "section table")
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * 64) for i in range(count)]
        names: set[str] = set()
        for _, kind, _, _, offset, length, link, _, _, sym_size in sections:
            if kind != _SHT_DYNSYM:
                continue
            if sym_size != 24 or length % 24 or length // 24 > _MAX_SYMBOLS or link >= count:
                raise ValueError("its dynamic symbol table is malformed")
            symbols = _read(f, offset, length, size, "dynamic symbol table")
            strings = _read(f, sections[link][4], sections[link][5], size, "dynamic string table")
            for i in range(length // 24):
                name_at, info, _, shndx = struct.unpack_from("<IBBH", symbols, i * 24)
                if shndx == 0 or info >> 4 not in (_STB_GLOBAL, _STB_WEAK) or info & 0xF != _STT_FUNC:
                    continue
                end = strings.find(b"\0", name_at)
                if name_at < len(strings) and end > name_at:
                    names.add(strings[name_at:end].decode("utf-8", "replace"))
        return names


def library_problem(path: Path, symbols: tuple[str, ...] = (VERSION_SYMBOL,)) -> str | None:
    """Why `path` is not a kernel library we built (None when it is): it must be a whole ELF
    shared object exporting `symbols` (by default the ABI version function every unit has)."""
    try:
        exported = exported_functions(path)
    except (OSError, ValueError) as err:
        return f"{path.name}: {err}"
    missing = [s for s in symbols if s not in exported]
    return f"{path.name} does not export {', '.join(missing)}" if missing else None
