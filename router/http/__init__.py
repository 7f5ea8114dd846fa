"""The HTTP edge: the ASGI app and its routes, the generation endpoints' dispatch, the
request context (request id, access line, metrics), and JSON and error bodies."""
