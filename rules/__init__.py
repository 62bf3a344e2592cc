"""Installed as seedance.rules_data: the YAML rule files live beside this file."""
