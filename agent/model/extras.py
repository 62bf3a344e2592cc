"""The optional parts pip installs as extras (pyproject.toml [project.optional-dependencies]),
and the one line a command gives when the one it needs is missing: the install command to
run, never an ImportError's traceback.  `seedance doctor` lists them from here."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import NotAvailable


@dataclass(frozen=True)
class Extra:
    name: str  # pip install 'seedance[NAME]'
    modules: tuple  # what must import for it to be present
    purpose: str


EXTRAS = (
    Extra("plot", ("matplotlib",), "pictures: pareto/bench --plot, profile heat maps and launch timelines"),
    Extra("otlp", ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
          "the agent's OTLP metrics export (--otlp-endpoint)"),
)


def extra_named(name: str) -> Extra:
    return next(extra for extra in EXTRAS if extra.name == name)


def missing(extra: str, what: str, exc: ImportError) -> NotAvailable:
    """The error for WHAT (a command or option) when the extra's import failed."""
    module = getattr(exc, "name", None) or "a module of it"
    return NotAvailable(f"{what} needs the '{extra}' extra ({module} is not installed): "
                        f"pip install 'seedance[{extra}]'")


def pyplot(what: str):
    """matplotlib.pyplot on the Agg backend (files, no display), or NotAvailable naming the
    [plot] extra."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise missing("plot", what, exc) from None
    return plt
