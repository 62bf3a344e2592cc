"""Reading the user's files within stated caps (yamlio.py: the one bounded YAML loader) and keeping
seedance's own cache files private (private.py).
"""
