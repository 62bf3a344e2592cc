"""Collectors: turn files, processes, configs and caches into Facts for the rule engine.

Each module observes one area and returns Facts; none of them judges (rules do) and none
of them prints (commands do).  scan.py ties them together for `seedance check`.
"""
