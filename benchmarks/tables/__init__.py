"""Result tables: every table of README.md and docs/results/ generated from benchmarks/results/ (pages.py)."""
