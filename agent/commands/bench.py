"""seedance bench: benchmark a plugin (latency/throughput)."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "bench", "Benchmark a plugin (latency/throughput)", "the plugins issue")
