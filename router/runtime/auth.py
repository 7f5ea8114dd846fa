"""Who may call the gateway: client API keys for the API, one key for `/admin/*`.

Client keys are kept as SHA-256 digests and looked up by the digest of what the client
sends, so no comparison depends on how much of a key an attacker has guessed. A verified
key's name is the request's `api_key_name` for the rules; without configured keys the
name comes from `classification.api_key_name_header` only when nobody beyond loopback can
send it (or an authenticating proxy in front is trusted to set it).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from router.config import ConfigError, GatewayConfig, read_secret
from router.errors import AuthenticationFailed

BEARER = "bearer "


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer_token(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization", "")
    if value[: len(BEARER)].lower() != BEARER:
        return None
    return value[len(BEARER) :].strip() or None


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ClientAuth:
    def __init__(self, config: GatewayConfig) -> None:
        self._names: dict[str, str] = {}  # sha256 hex of a key -> its name
        for i, entry in enumerate(config.auth.api_keys):
            if entry.sha256 is not None:
                self._names[entry.sha256] = entry.name
                continue
            where = f"auth.api_keys[{i}] ({entry.name})"
            key = _secret(config, where, env=entry.key_env, file=entry.key_file)
            if not key:  # never a key: an empty bearer token is no token
                raise ConfigError(f"{config.source}: {where}: the key is empty")
            self._names[digest(key)] = entry.name
        trusted = config.auth.trust_key_name_header or is_loopback(config.server.host)
        self._name_header = config.classification.api_key_name_header.lower() if trusted else None

    @property
    def required(self) -> bool:
        return bool(self._names)

    @property
    def names(self) -> frozenset[str]:
        """The configured keys' names (a name sent in a header need not be one)."""
        return frozenset(self._names.values())

    def key_name(self, headers: Mapping[str, str]) -> str | None:
        """The caller's key name; raises AuthenticationFailed when keys are required and the
        request has no valid one."""
        if not self._names:
            return headers.get(self._name_header) if self._name_header else None
        token = bearer_token(headers)
        name = self._names.get(digest(token)) if token is not None else None
        if name is None:
            raise AuthenticationFailed(
                "a valid API key is required: send it as 'Authorization: Bearer <key>'"
            )
        return name


def upstream_credentials(config: GatewayConfig) -> dict[str, str]:
    """Base URL -> the API key that backend expects; ConfigError if one cannot be read."""
    keys = {}
    for i, entry in enumerate(config.upstreams.credentials):
        where = f"upstreams.credentials[{i}]"
        key = _secret(config, where, env=entry.api_key_env, file=entry.api_key_file)
        if key is not None:
            keys[entry.url] = key
    return keys


class AdminAuth:
    def __init__(self, config: GatewayConfig) -> None:
        admin = config.admin
        self._key = _secret(
            config, "admin", value=admin.api_key, env=admin.api_key_env, file=admin.api_key_file
        )
        if not self._key:
            self._key = None  # an empty key is no key
        if self._key is None and not is_loopback(config.server.host):
            raise ConfigError(
                f"{config.source}: admin: /admin/* would be open to anyone who can reach "
                f"{config.server.host}: set admin.api_key_file or admin.api_key_env"
            )

    def check(self, headers: Mapping[str, str]) -> None:
        if self._key is None:
            return
        token = bearer_token(headers) or ""
        if not hmac.compare_digest(token.encode(), self._key.encode()):
            raise AuthenticationFailed(
                "a valid admin key is required: 'Authorization: Bearer <key>'"
            )


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys one configuration names for callers of the gateway, every secret read once;
    ConfigError if one cannot be read or the admin API would be open to the network."""

    client: ClientAuth
    admin: AdminAuth

    @classmethod
    def load(cls, config: GatewayConfig) -> Keys:
        return cls(ClientAuth(config), AdminAuth(config))


def _secret(
    config: GatewayConfig,
    where: str,
    *,
    value: str | None = None,
    env: str | None = None,
    file: str | None = None,
) -> str | None:
    """`read_secret`, its failure named by file and field."""
    try:
        return read_secret(value=value, env=env, file=file, base_dir=config.base_dir)
    except ValueError as exc:
        raise ConfigError(f"{config.source}: {where}: {exc}") from None
