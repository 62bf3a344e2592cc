"""seedance fix: apply safe fixes for findings (relink, env-leak, torch-ext, undo)."""
from ._notyet import register


def configure_parser(sub):
    register(sub, "fix", "Apply safe fixes for findings (relink, env-leak, torch-ext, undo)", "the safe-fixes issue")
