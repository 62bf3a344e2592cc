"""Subcommands: each module parses, calls the core and renders.  Nothing else prints."""
