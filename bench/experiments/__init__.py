"""One-off experiments: each module answers one question about what the gateway costs, with
the figures README.md or docs/benchmarks.md quotes. Run one from the repository root, or
anywhere the project is installed: `python -m bench.experiments.<name>`; its docstring says
what it measures and how.

Unlike `pd-gateway bench`, they are not kept comparable from run to run: each measures what
its question needs.
"""
