"""seedance run: wrap a command with the CUDA shim (affinity, quotas, per-instance handles)."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "run", "Wrap a command with the CUDA shim (affinity, quotas, per-instance handles)", "the transparent-wrapping issue")
