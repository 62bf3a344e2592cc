"""What reading an ELF object gives: ElfInfo, VersionNeed, Symbol.

Both readers return these: the C one (fastread.py) and the Python reference (reader.py).
They live apart from reader.py so that a `seedance ldd`, which reads through the C reader,
imports neither the Python parser (mmap, struct, re, functools) nor dataclasses, which a
short command would pay at every start (record.py says what these frozen records keep of
the dataclasses they were).
"""
from __future__ import annotations

from ..model.record import FrozenRecord, set_fields

DF_1_NODEFLIB = 0x800
# Symbol.binding and Symbol.type: the names of st_info's two halves, as both readers spell them
STB_LOCAL, STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 0, 1, 2, 10
BIND_NAMES = {STB_LOCAL: "LOCAL", STB_GLOBAL: "GLOBAL", STB_WEAK: "WEAK", STB_GNU_UNIQUE: "UNIQUE"}
STT_NAMES = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 3: "SECTION", 4: "FILE", 5: "COMMON", 6: "TLS",
             10: "IFUNC"}


class VersionNeed(FrozenRecord):
    """One verneed file entry: the versions this object needs from ``file`` (a NEEDED name)."""
    _fields = ("file", "versions")

    def __init__(self, file: str, versions: tuple):  # versions: of (name, weak)
        set_fields(self, {"file": file, "versions": versions})


class Symbol(FrozenRecord):
    _fields = ("name", "defined", "binding", "type", "version", "hidden")

    # version: the version node bound to it, if any; hidden: the verdef/versym hidden bit
    # (not a default version)
    def __init__(self, name: str, defined: bool, binding: str, type: str, version: str | None = None,
                 hidden: bool = False):
        set_fields(self, {"name": name, "defined": defined, "binding": binding, "type": type,
                                     "version": version, "hidden": hidden})


class ElfInfo(FrozenRecord):
    _fields = ("path", "elf_class", "little_endian", "machine", "osabi", "e_type", "interpreter", "needed",
               "soname", "rpath", "runpath", "flags", "flags_1", "version_needs", "version_defs", "build_id",
               "has_sections", "has_dynamic", "symbols", "fatbin", "section_names")
    _compared = _fields[:-1]  # section_names is left out of == and hash()
    # the fields a reader may leave out, and their values then
    DEFAULTS = {"needed": (), "soname": None, "rpath": (), "runpath": (), "flags": 0, "flags_1": 0,
                "version_needs": (),  # of VersionNeed
                "version_defs": (),  # names, excluding the base (file) entry
                "build_id": None, "has_sections": False, "has_dynamic": False,
                "symbols": (),  # of Symbol; only when read with symbols=True
                "fatbin": (),  # of fatbin.FatbinEntry; only when read with fatbin=True
                "section_names": ()}

    def __init__(self, path: str, elf_class: int, little_endian: bool, machine: int, osabi: int, e_type: int,
                 interpreter: str | None, **rest):
        unknown = set(rest) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"ElfInfo.__init__() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        values = {"path": path, "elf_class": elf_class,  # 32 or 64
                  "little_endian": little_endian, "machine": machine, "osabi": osabi, "e_type": e_type,
                  "interpreter": interpreter}
        for name, default in self.DEFAULTS.items():
            values[name] = rest.get(name, default)
        set_fields(self, values)

    @property
    def nodeflib(self) -> bool:
        return bool(self.flags_1 & DF_1_NODEFLIB)

    @property
    def abi_key(self) -> tuple:
        """What ld.so compares before accepting a candidate file (elf_machine_matches_host)."""
        return (self.elf_class, self.little_endian, self.machine)

    def defined_symbols(self) -> dict:
        """name -> set of version names it is defined under (None for unversioned)."""
        out: dict = {}
        for sym in self.symbols:
            if sym.defined and sym.binding != "LOCAL":
                out.setdefault(sym.name, set()).add(sym.version)
        return out
