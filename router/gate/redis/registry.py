"""The deployment's node registry: every replica may grant any node of a pool to any other,
so each node's settings are kept where all can read them (a hash of records.py records)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from router.gate.events import GateEvents
from router.gate.redis.client import UNAVAILABLE, GateRedis
from router.gate.redis.records import RecordUnreadable, decode_node, encode_node
from router.node import Node

log = logging.getLogger("pd_gateway.gate")


class NodeRegistry:
    def __init__(self, redis: GateRedis, key: str, metrics: GateEvents) -> None:
        self._redis = redis
        self._key = key
        self._metrics = metrics

    async def publish(self, nodes: Iterable[Node]) -> None:
        """Share these nodes' settings; a failure is logged (they are shared again when the
        pool changes or its state is found lost)."""
        records = {node.id: encode_node(node) for node in nodes}
        if not records:
            return
        try:
            await self._redis.run(lambda client: client.hset(self._key, mapping=records))  # type: ignore[arg-type]
        except UNAVAILABLE as exc:
            log.warning("could not share this pool's node settings: %s", exc)

    async def read(self, node_id: str) -> Node | None:
        """The node's settings as another replica shared them; None if none were shared, or
        if they cannot be read (logged and counted). One of client.UNAVAILABLE if Redis
        cannot be reached."""
        raw = await self._redis.run(lambda client: client.hget(self._key, node_id))
        if raw is None:
            return None
        try:
            return decode_node(str(raw))
        except RecordUnreadable as exc:
            self._metrics.unreadable_record(exc.reason)
            log.error("node %s: its shared settings cannot be read (%s): not granted", node_id, exc)
            return None
