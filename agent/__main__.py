from .cli import console

console(front_end=False)  # (what seedance-run execs for the runs it leaves to Python)
