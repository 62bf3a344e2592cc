"""seedance: find and fix the hidden traps that waste GPU compute and break GPU plugins."""
__version__ = "0.1.0"
