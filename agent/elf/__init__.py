"""ELF reading: what ld.so reads (dynamic section, versions, symbols) plus CUDA fatbins."""
from .reader import ElfInfo, Symbol, VersionNeed, is_elf, read_elf  # noqa: F401
