"""seedance agent: the resident agent (systemd user service)."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "agent", "The resident agent (systemd user service)", "the agent issue")
