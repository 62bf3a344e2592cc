"""seedance trace: trace library loads, loader errors and CUDA memory live with eBPF."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "trace", "Trace library loads, loader errors and CUDA memory live with eBPF", "the live-tracing issue")
