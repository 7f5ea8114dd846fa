"""What the gateway has learned about each TileRT node: its release and its engine's features.

The prober fills it (at start-up, then every `gate.capabilities_interval_s`); the capability
guard reads it, so a feature goes to the latency path only while every node that reported
its facts supports it. A node's typed refusal corrects it at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.upstream.tilert import NodeFacts


class NodeFactsBook:
    """Node id -> the facts it last reported. `version` counts changes (a cheap staleness
    check for whoever derives something from the book)."""

    def __init__(self) -> None:
        self._facts: dict[str, NodeFacts] = {}
        self.members: dict[str, list[str]] = {}
        """Model -> its pool's node ids, where discovery changed them from the configured."""
        self.version = 0

    def set_members(self, model: str, node_ids: list[str]) -> None:
        self.members[model] = node_ids
        self.version += 1

    def learn(self, node_id: str, facts: NodeFacts) -> None:
        if self._facts.get(node_id) != facts:
            self._facts[node_id] = facts
            self.version += 1

    def forget(self, node_id: str) -> None:
        if self._facts.pop(node_id, None) is not None:
            self.version += 1

    def lacks(self, node_id: str, feature: str) -> None:
        """The node refused a request for want of `feature`: believe it until its next probe."""
        facts = self._facts.get(node_id)
        if facts is not None and feature in facts.features:
            self.learn(node_id, NodeFacts(facts.version, facts.features - {feature}, facts.engine))

    def get(self, node_id: str) -> NodeFacts | None:
        return self._facts.get(node_id)

    def features(
        self, node_ids: Iterable[str], unreported: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        """What every node that has reported (of `node_ids`) supports; `unreported` if none
        has."""
        known = [self._facts[n].features for n in node_ids if n in self._facts]
        return frozenset.intersection(*known) if known else unreported
