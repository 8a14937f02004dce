"""Leaf utilities every part may use: the clocks, configuration, paths, formatting of sizes and
times, the spool file format, disk-full checks, process priority and the web token. Nothing
here imports another part of gpuwatch."""
