"""Post-run analysis: pure functions over a read-only connection (compare, export, report)."""
