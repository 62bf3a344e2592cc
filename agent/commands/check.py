"""seedance check: forensic check of files, directories, processes or this host."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "check", "Check files, processes or this host for GPU traps", "the check issue")
