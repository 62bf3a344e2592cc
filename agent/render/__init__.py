"""Output: the one writer every output path goes through (output.py), the text, JSON, SARIF and graph
renderers, progress on stderr and the terminal's width.
"""
