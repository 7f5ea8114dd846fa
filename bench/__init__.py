"""`pd-gateway bench`: what the gateway adds to a request, side by side with no gateway.

Starts the simulated stack and `pd-gateway serve` as children, runs interleaved rounds of
direct orchestration and the gateway (and any installed peer) on both paths at several
concurrencies, and writes the results as JSON, a Markdown table and PNG plots.

Like `sim/`, this package is test equipment beside the gateway, not part of it: the CLI
imports it only when `bench` runs, and the container image leaves it out.
`bench.experiments` holds the one-off experiments, one question each.
"""

from bench.command import run_bench
from bench.options import BenchOptions

__all__ = ["BenchOptions", "run_bench"]
