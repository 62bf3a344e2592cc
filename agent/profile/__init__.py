"""Analysis over measurements: cost-accuracy Pareto, memory maps, launches, call graphs.

These modules take plain data (rows, events, samples) and return dataclasses; the
commands in seedance.commands render them and the rule engine judges their facts.
"""
