"""seedance profiler: GPU memory fragmentation profiler."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "profiler", "GPU memory fragmentation profiler", "a later issue")
