"""Accuracy corpus (issue 11): every verdict of `seedance check` compared with loading the
object for real.  bench/bench_accuracy.py prints the table over all of it."""
