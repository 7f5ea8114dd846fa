"""The plain-HTTP client test helpers share for their calls to simulators and gateways.

httpx builds a TLS context for every client it makes, reading the whole CA bundle (about
0.1 s on a loaded 2-core machine), and `httpx.get` makes a client per call: helpers
that poll several times a second spent most of their time there. Everything they call
is plain HTTP on localhost, so one client without TLS verification serves them all. It
keeps no idle connection: a connection the server closes while idle cannot fail the
next call.
"""

from __future__ import annotations

import functools

import httpx


@functools.cache
def plain() -> httpx.Client:
    """The process's shared client (thread-safe, as httpx's connection pool is)."""
    return httpx.Client(verify=False, limits=httpx.Limits(max_keepalive_connections=0))
