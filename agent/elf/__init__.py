"""ELF reading: what ld.so reads (dynamic section, versions, symbols) plus CUDA fatbins."""
from .info import ElfInfo, Symbol, VersionNeed  # noqa: F401


def __getattr__(name):
    # reader.py (the Python parser: mmap, struct, re) is imported on first use, so that a
    # `seedance ldd` reading through the C reader never pays for those imports
    if name in ("is_elf", "read_elf"):
        from . import reader

        return getattr(reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
