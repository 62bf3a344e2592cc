"""seedance plugin: install, list and verify GPU plugins."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "plugin", "Install, list and verify GPU plugins", "the plugins issue")
