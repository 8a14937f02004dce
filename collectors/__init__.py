"""Collectors: one module per source (NVML, host, processes), each returning plain typed records.

They know nothing of the store or the TUI; a caller turns a record into a row with
dataclasses.asdict, since every record's fields are its table's column names.
"""
