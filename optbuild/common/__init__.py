"""Foundations every layer may use: errors, digests, atomic files, confined paths, units, the
host fingerprint, tool versions, and reading or importing a user's Python files (never from
stale bytecode). Imports nothing else of optbuild."""
