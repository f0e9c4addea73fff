"""Pure functions that build the desired child objects: plain data in, plain
dicts out, no I/O (an import-linter contract keeps it so)."""
