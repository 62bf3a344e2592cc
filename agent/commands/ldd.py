"""seedance ldd: a safe ldd that executes nothing."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "ldd", "Print shared-library dependencies without executing anything", "the check issue")
