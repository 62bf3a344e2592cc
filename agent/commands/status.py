"""seedance status: show instances, devices, leaks and findings from the agent."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "status", "Show instances, devices, leaks and findings from the agent", "the agent issue")
