"""How one path chooses its servers: the composition of its server sets (the scorers and
their weights) and what a request offers their request-aware scorers, worked out once per
request and only where a set would use it."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from router.selection.affinity import Affinity
from router.selection.request_keys import AffinityKeys
from router.selection.server_set import ServerSet, Weights, default_set


class PathSelection:
    def __init__(self, keys: AffinityKeys | None = None, weights: Weights | None = None) -> None:
        """`keys` None: no request-aware scorers (health and load only)."""
        self._keys = keys
        self.weights = weights or Weights()

    def server_set(
        self, urls: Sequence[str], name: str, *, request_aware: bool = True
    ) -> ServerSet:
        """A fresh set of `urls` (its own prefix index); `request_aware` False: by health
        and load only, whatever the request offers."""
        scorers = self._keys.scorers(self.weights) if self._keys and request_aware else []
        return default_set(urls, name=name, request_scorers=scorers, weights=self.weights)

    async def affinity(
        self,
        sets: Iterable[ServerSet],
        endpoint: str,
        body: dict[str, Any],
        headers: Mapping[str, str],
        *,
        always: bool = False,
        known: dict[Hashable, Affinity] | None = None,
    ) -> Affinity | None:
        """What the request offers, or None where no set would look at it (`always`: the
        caller looks at it itself). `known`: what the request offered paths before, by the
        way it was worked out: a prompt is encoded once per request, not once per path."""
        if self._keys is None or not (always or any(s.request_aware for s in sets)):
            return None
        shape = self._keys.shape
        if known is not None and (found := known.get(shape)) is not None:
            return found
        found = await self._keys.of(endpoint, body, headers)
        if known is not None:
            known[shape] = found
        return found


@runtime_checkable
class ServedBy(Protocol):
    """A path that chooses among servers: its sets, for probes, metrics and the admin API."""

    def server_sets(self) -> list[ServerSet]: ...


def sets_of(paths: Iterable[object]) -> list[ServerSet]:
    """The server sets of `paths`, each once."""
    found: list[ServerSet] = []
    for path in paths:
        if isinstance(path, ServedBy):
            found += [s for s in path.server_sets() if s not in found]
    return found
