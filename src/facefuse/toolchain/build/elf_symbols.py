"""Read named data arrays out of an ELF shared object without loading it.

Compiled-in weights (C arrays such as ``float conv1_weight[16*3*3] = {…}``)
are data symbols: the symbol table gives each one's address and size, the
section holding that address gives its place in the file. This reader never
maps or executes the library; it only parses headers and copies bytes.

Supported: 64-bit little-endian ELF (x86-64, aarch64), ``.symtab`` or, when
stripped, ``.dynsym``; ``RELA`` relocation sections (used to follow pointers
in data tables of a position-independent library).

Format (System V gABI): the file header gives the section-header table
(``e_shoff``, ``e_shentsize``, ``e_shnum``); a symbol table section
(``SHT_SYMTAB``/``SHT_DYNSYM``) holds 24-byte ``Elf64_Sym`` records whose
names are offsets into the string table named by its ``sh_link``; a
``SHT_RELA`` section holds 24-byte ``Elf64_Rela`` records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facefuse.errors import BuildError

SHT_SYMTAB = 2
SHT_RELA = 4
SHT_NOBITS = 8
SHT_DYNSYM = 11
#: x86-64 ``R_X86_64_RELATIVE`` / aarch64 ``R_AARCH64_RELATIVE``: base + addend.
RELATIVE_RELOCATIONS = frozenset({8, 1027})
#: x86-64 ``R_X86_64_64`` / aarch64 ``R_AARCH64_ABS64``: symbol + addend.
ABSOLUTE_RELOCATIONS = frozenset({1, 257})


@dataclass(frozen=True)
class Section:
    """One section header: type, virtual address, file offset and size (bytes)."""

    name: str
    kind: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    """One symbol: virtual address (``value``), size in bytes, section index."""

    name: str
    value: int
    size: int
    section: int


class ElfFile:
    """A parsed ELF64 little-endian file held in memory (bytes only)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.data = self.path.read_bytes()
        d = self.data
        if d[:4] != b"\x7fELF":
            raise BuildError(f"{self.path.name} is not an ELF file")
        if d[4] != 2 or d[5] != 1:
            raise BuildError(f"{self.path.name}: only 64-bit little-endian ELF is supported")
        shoff, = struct.unpack_from("<Q", d, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
        if shoff == 0 or shnum == 0 or shoff + shnum * shentsize > len(d):
            raise BuildError(f"{self.path.name}: no usable section headers")
        raw = [
            struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)
        ]
        names_at = raw[shstrndx][4]
        self.sections = [
            Section(self._cstr(names_at + r[0]), r[1], r[3], r[4], r[5], r[6], r[9])
            for r in raw
        ]
        self.symbols = self._read_symbols()

    def _cstr(self, offset: int) -> str:
        end = self.data.index(b"\0", offset)
        return self.data[offset:end].decode("ascii", "replace")

    def symbol_table(self, index: int) -> list[Symbol]:
        """The records of the symbol-table section ``index``, in order (index 0 is null)."""
        table = self.sections[index]
        strtab = self.sections[table.link]
        out: list[Symbol] = []
        for off in range(table.offset, table.offset + table.size, table.entsize or 24):
            name_off, _info, _other, shndx, value, size = struct.unpack_from(
                "<IBBHQQ", self.data, off)
            out.append(Symbol(self._cstr(strtab.offset + name_off), value, size, shndx))
        return out

    def _read_symbols(self) -> dict[str, Symbol]:
        kinds = [SHT_SYMTAB] if any(s.kind == SHT_SYMTAB for s in self.sections) else []
        out: dict[str, Symbol] = {}
        for i, sec in enumerate(self.sections):
            if sec.kind in (kinds or [SHT_DYNSYM]):
                for sym in self.symbol_table(i):
                    if sym.name:
                        out.setdefault(sym.name, sym)
        return out

    def file_offset(self, addr: int, size: int) -> int:
        """File offset of ``size`` bytes at virtual address ``addr`` (in a section with data)."""
        for s in self.sections:
            inside = s.addr <= addr and addr + size <= s.addr + s.size
            if s.kind != SHT_NOBITS and s.addr and inside:
                return s.offset + (addr - s.addr)
        raise BuildError(f"{self.path.name}: address {addr:#x} is not in a data section")

    def symbol_bytes(self, name: str) -> bytes:
        """The bytes a data symbol occupies."""
        sym = self.symbols.get(name)
        if sym is None:
            raise BuildError(f"{self.path.name}: no symbol {name!r}")
        off = self.file_offset(sym.value, sym.size)
        return self.data[off : off + sym.size]

    def float_array(self, name: str, count: int | None = None) -> np.ndarray:
        """A ``float`` array symbol as float32 (``count`` elements checked when given)."""
        raw = self.symbol_bytes(name)
        if len(raw) % 4:
            raise BuildError(f"{name}: {len(raw)} bytes is not a float array")
        arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        if count is not None and arr.size != count:
            raise BuildError(f"{name}: {arr.size} floats, expected {count}")
        if not np.all(np.isfinite(arr)):
            raise BuildError(f"{name}: non-finite values")
        return arr

    def pointer_targets(self) -> dict[int, str]:
        """Virtual address of each relocated pointer slot → name of the symbol it points to.

        Follows ``RELATIVE`` relocations (base + addend: the symbol starting at
        the addend) and ``ABS64`` ones (the named symbol, addend 0): the two ways
        a position-independent library's table of array pointers is relocated.
        """
        out: dict[int, str] = {}
        for s in self.sections:
            if s.kind != SHT_RELA:
                continue
            symbols = self.symbol_table(s.link) if s.link else []
            for off in range(s.offset, s.offset + s.size, s.entsize or 24):
                r_offset, r_info, r_addend = struct.unpack_from("<QQq", self.data, off)
                kind, index = r_info & 0xFFFFFFFF, r_info >> 32
                if kind in RELATIVE_RELOCATIONS:
                    name = self.symbol_at(r_addend)
                elif kind in ABSOLUTE_RELOCATIONS and r_addend == 0 and index < len(symbols):
                    name = symbols[index].name or None
                else:
                    name = None
                if name:
                    out[r_offset] = name
        return out

    def symbol_at(self, addr: int) -> str | None:
        """Name of the sized symbol that starts at ``addr``, if any."""
        for sym in self.symbols.values():
            if sym.value == addr and sym.size > 0:
                return sym.name
        return None
