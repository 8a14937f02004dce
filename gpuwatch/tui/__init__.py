"""The Textual TUI: an App fed by a data source, screens that only render snapshots.

Nothing here is imported by the CLI until `gpuwatch tui` runs (textual is a heavy import).
"""
