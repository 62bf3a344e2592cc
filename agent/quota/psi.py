"""Pressure stall information (Documentation/accounting/psi.rst).

A PSI file has two lines, `some` and `full`, each `avg10=.. avg60=.. avg300=.. total=..`;
the averages are percentages of wall time in which some (or all) tasks stalled.
"""
from __future__ import annotations


def read_pressure(path: str) -> dict:
    """{'some': {'avg10': 1.5, ...}, 'full': {...}}; an unreadable file raises OSError."""
    out = {}
    with open(path, encoding="ascii", errors="replace") as handle:
        for line in handle:
            kind, *pairs = line.split()
            values = {}
            for pair in pairs:
                key, _, value = pair.partition("=")
                try:
                    values[key] = float(value)
                except ValueError:
                    continue
            out[kind] = values
    return out


def pressure_value(read, key: str) -> float:
    """key is <resource>_<some|full>_<avgN>; ``read(resource)`` returns read_pressure's dict."""
    resource, kind, window = key.split("_")
    return read(resource)[kind][window]
