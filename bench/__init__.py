"""`pd-gateway bench`: what the gateway adds to a request, side by side with no gateway.

Starts the simulated stack and `pd-gateway serve` as children, runs interleaved rounds of
direct orchestration and the gateway (and any installed peer) on both paths at several
concurrencies, and writes the results as JSON, a Markdown table and PNG plots.

Like `sim/` and `demo/`, this package is test equipment beside the gateway, not part of it:
the gateway never imports it (`cli.py` registers the command, router/commands.py loads
it), and the container image leaves it out. `command.py` runs a bench from end to end;
`bench.experiments` holds the one-off experiments, one question each.
"""
