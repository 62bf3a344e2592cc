"""The rule engine: rules loaded from rules/*.yaml and validated (engine.py), the CEL subset their
conditions are written in (cel_subset.py), and the user's filters and baselines (filters.py).
"""
