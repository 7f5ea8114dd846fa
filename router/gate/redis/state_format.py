"""The version of what the gate's scripts store in Redis: the keys keys.py names, their
types and the meaning of every value in them (docs/redis.md's key layout). Replicas of two
releases run their own scripts against the same keys at once during a rolling update, so
both must agree on every key's meaning; this version is how a replica knows that they do.

The deployment's format key (`<base>:format`, a string) holds the newest version any
script has written there. Every script reads it before anything else and:

* refuses when this release does not read that version: it touches nothing, and answers
  `FORMAT <version>`, which the call raises as `StateUnreadable` (logged as an error and
  counted as an unreadable record of reason `state_version`); the caller refuses as when
  Redis cannot be reached, so no node is ever handed out on a misread state;
* otherwise raises it to the version this release writes, when it is lower or missing. A
  missing key is a state written by a release before the key (version 1) or none yet.

The rule between versions (the node records' rule, records.py, for the whole layout):

* a change an older release would misread (a key or field renamed, removed or given
  another meaning, a value written another way) takes a new number; an addition an older
  release never reads, and whose absence this one handles, takes none;
* a release that introduces version N+1 reads N and N+1 but still writes N; only the
  release after it writes N+1, once no replica that cannot read N+1 is left. A replica of a
  release that reads only N then meets N+1 in the format key and refuses every call;
* values are never rewritten in bulk: a release stops reading N only with a conversion of
  its own, shipped with the version that needs it.

docs/upgrades.md gives the rolling-update steps for each kind of release.
"""

from __future__ import annotations

from redis.exceptions import ResponseError

WRITES = 1  # the version this release writes
READS = frozenset({1})  # the versions it reads


class StateUnreadable(ResponseError):
    """The deployment's state is written in `version`, which this release does not read:
    the script refused before touching it. A ResponseError, so one of client.UNAVAILABLE:
    every caller refuses as when Redis cannot answer."""

    def __init__(self, version: str) -> None:
        super().__init__(
            f"the gate's state in Redis is written in format version {version!r};"
            f" this release reads {sorted(READS)} (docs/upgrades.md)"
        )
        self.version = version


def lua_constants() -> str:
    """The Lua definitions of WRITES and READS that common.lua checks the format key by."""
    reads = ", ".join(f'["{version}"] = true' for version in sorted(READS))
    return f"local STATE_WRITES = {WRITES}\nlocal STATE_READS = {{{reads}}}\n"
