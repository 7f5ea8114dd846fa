"""Who a request is from: the configured sources in order, a default, and names bounded
whatever a client sends."""

from __future__ import annotations

import pytest

from router.config import TenantsConfig
from router.tenants.identity import DEFAULT_TENANT, bounded_name, tenant_of

CONFIG = TenantsConfig(identify=["api_key", "header", "user"], header="x-tenant")


@pytest.mark.parametrize(
    ("key_name", "headers", "user", "tenant"),
    [
        ("acme-prod", {"x-tenant": "ignored"}, "u1", "acme-prod"),
        (None, {"x-tenant": "team-a"}, "u1", "team-a"),
        (None, {}, "u1", "u1"),
        (None, {}, None, DEFAULT_TENANT),
        (None, {"x-tenant": ""}, "", DEFAULT_TENANT),
    ],
)
def test_the_first_source_that_names_one(
    key_name: str | None, headers: dict[str, str], user: str | None, tenant: str
) -> None:
    assert tenant_of(CONFIG, key_name=key_name, headers=headers, user=user) == tenant


def test_a_header_is_not_trusted_unless_configured() -> None:
    keys_only = TenantsConfig()
    assert tenant_of(keys_only, key_name=None, headers={"x-tenant": "me"}, user="u") == "default"


@pytest.mark.parametrize("name", ["x" * 65, "ünïcode", "a b", "-lead", "x" * 1_000_000, "\x00"])
def test_any_name_is_bounded_and_still_one_per_name(name: str) -> None:
    bounded = bounded_name(name)
    assert len(bounded) <= 64 and bounded.isascii() and " " not in bounded
    assert bounded_name(name + "!") != bounded
    assert bounded_name(name) == bounded


def test_a_plain_name_is_kept() -> None:
    assert bounded_name("acme.prod@eu-1:team_7") == "acme.prod@eu-1:team_7"


def test_named_limits_replace_every_one_where_set() -> None:
    config = TenantsConfig(
        every={"requests_per_minute": 60, "tokens_per_minute": 1000},
        named={"acme": {"requests_per_minute": 600}},
    )
    acme = config.tenant("acme")
    assert (acme.requests_per_minute, acme.tokens_per_minute) == (600, 1000)
    assert config.tenant("other").requests_per_minute == 60
