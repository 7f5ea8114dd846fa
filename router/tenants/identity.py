"""Who a request is from: the tenant's name, from the sources `tenants.identify` names in
order, bounded whatever a client sends."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from router.config import TenantsConfig

DEFAULT_TENANT = "default"
"""The tenant of requests that name none."""
MAX_NAME = 64
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$")


def tenant_of(
    config: TenantsConfig,
    *,
    key_name: str | None,
    headers: Mapping[str, str],
    user: str | None,
) -> str:
    """The first name the configured sources give, bounded (`bounded_name`); else
    `DEFAULT_TENANT`."""
    for source in config.identify:
        if source == "api_key":
            name = key_name
        elif source == "header":
            name = headers.get(config.header or "") if config.header else None
        else:
            name = user
        if name:
            return bounded_name(name)
    return DEFAULT_TENANT


def bounded_name(name: str) -> str:
    """A name as it is: letters, digits and `_.:@-`, at most 64 characters; any other a
    readable prefix and a hash of the whole (still one name per name, and no longer than 64
    characters whatever the client sends)."""
    if _PLAIN.match(name):
        return name
    readable = re.sub(r"[^A-Za-z0-9_.:@-]", "_", name[:40])
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{readable}~{digest}"
