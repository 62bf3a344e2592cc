"""The data model every part shares: facts, findings and reports (report.py), the records they are
built from (record.py), and the one error hierarchy with its exit codes (errors.py).
"""
