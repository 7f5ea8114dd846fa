"""What replicas share besides the scripts' own state (versioned as a whole by
state_format.py): each node's settings, so that a replica can use a node another replica
found. A format of its own, not the configuration's model, so that a renamed setting never
breaks a rolling update.

A record is a JSON object with a version field `v`. The rule between versions:

* a reader ignores fields it does not know, so a version may add optional fields without
  a new number;
* a new number is for a change an older reader would misread (a field renamed, removed or
  given another meaning); a reader refuses a version it does not know (`RecordUnreadable`)
  rather than guess;
* a release that introduces version N+1 reads it but still writes N; only the release after
  it writes N+1, once no replica that cannot read it is left.
"""

from __future__ import annotations

import json
from typing import Any, TypeGuard, get_args

from router.config import TileRTVersion
from router.node import Node

WRITES = 1  # the version this release writes
READS = frozenset({1})  # the versions it reads


class RecordUnreadable(Exception):
    """A shared record this replica cannot read; `reason` is `version` or `malformed`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def encode_node(node: Node) -> str:
    """Version 1: id, host, ctrl_port, http_port, and when set name, tilert (the release the
    node must run) and pool (the latency pool it belongs to)."""
    record: dict[str, Any] = {
        "v": WRITES,
        "id": node.id,
        "host": node.host,
        "ctrl_port": node.ctrl_port,
        "http_port": node.http_port,
    }
    for field in ("name", "tilert", "pool"):
        if (value := getattr(node, field)) is not None:
            record[field] = value
    return json.dumps(record, separators=(",", ":"), sort_keys=True)


def decode_node(raw: str) -> Node:
    """The node a record describes; RecordUnreadable if its version is not one this release
    reads or it is not a valid record of that version."""
    try:
        record = json.loads(raw)
    except ValueError as exc:
        raise RecordUnreadable("malformed", f"not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise RecordUnreadable("malformed", "not a JSON object")
    version = record.get("v")
    if version not in READS:
        raise RecordUnreadable(
            "version", f"format version {version!r}; this release reads {sorted(READS)}"
        )
    host, ctrl_port, http_port = (
        record.get("host"),
        record.get("ctrl_port"),
        record.get("http_port"),
    )
    name, tilert, pool = record.get("name"), record.get("tilert"), record.get("pool")
    if not (
        isinstance(host, str)
        and host
        and _is_port(ctrl_port)
        and _is_port(http_port)
        and (name is None or isinstance(name, str))
        and tilert in (None, *get_args(TileRTVersion))
        and (pool is None or isinstance(pool, str))
    ):
        raise RecordUnreadable("malformed", f"not a version {version} node record: {raw[:200]}")
    node = Node(host, ctrl_port, http_port, name=name, tilert=tilert, pool=pool)
    if node.id != record.get("id"):
        raise RecordUnreadable("malformed", f"id {record.get('id')!r} is not {node.id!r}")
    return node


def _is_port(value: Any) -> TypeGuard[int]:
    return type(value) is int and 1 <= value <= 65535
