"""The core of `seedance run`: what the wrapped program did (report.py) and which paths are safe to
preload (preload.py).  commands/run.py parses and renders; the work lives here.
"""
