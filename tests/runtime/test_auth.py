"""Client keys and the admin key: verified by digest, names for the rules, never a hole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config import ConfigError, parse_config
from router.errors import AuthenticationFailed
from router.runtime.auth import AdminAuth, ClientAuth, digest
from router.upstream.httpx_transport import HttpxTransport

MODELS = [
    {"name": "m", "tokenizer": "deepseek", "throughput": {"mode": "proxy", "urls": ["http://p:1"]}}
]


def config(tmp_path: Path, **sections: Any):
    return parse_config({"models": MODELS, **sections}, base_dir=tmp_path, source="gw.yaml")


def test_keys_by_digest_env_and_file_name_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAM_KEY", "sk-team")
    (tmp_path / "batch.key").write_text("sk-batch\n")
    auth = ClientAuth(
        config(
            tmp_path,
            auth={
                "api_keys": [
                    {"name": "premium", "sha256": digest("sk-premium")},
                    {"name": "team", "key_env": "TEAM_KEY"},
                    {"name": "batch", "key_file": "batch.key"},
                ]
            },
        )
    )
    assert auth.required
    for key, name in [("sk-premium", "premium"), ("sk-team", "team"), ("sk-batch", "batch")]:
        assert auth.key_name({"authorization": f"Bearer {key}"}) == name
    for headers in [{}, {"authorization": "Bearer nope"}, {"authorization": "sk-team"}]:
        with pytest.raises(AuthenticationFailed):
            auth.key_name(headers)


def test_with_keys_the_key_name_header_is_ignored(tmp_path: Path) -> None:
    auth = ClientAuth(config(tmp_path, auth={"api_keys": [{"name": "a", "sha256": digest("k")}]}))
    headers = {"authorization": "Bearer k", "x-pd-api-key-name": "premium"}
    assert auth.key_name(headers) == "a"


@pytest.mark.parametrize(
    ("host", "trust", "expected"),
    [("127.0.0.1", False, "premium"), ("0.0.0.0", False, None), ("0.0.0.0", True, "premium")],
)
def test_without_keys_the_header_is_trusted_only_where_no_stranger_can_send_it(
    tmp_path: Path, host: str, trust: bool, expected: str | None
) -> None:
    c = config(
        tmp_path,
        server={"host": host},
        auth={"trust_key_name_header": trust},
        admin={"api_key": "admin"},
    )
    assert ClientAuth(c).key_name({"x-pd-api-key-name": "premium"}) == expected


def test_an_unreadable_key_names_its_entry(tmp_path: Path) -> None:
    c = config(tmp_path, auth={"api_keys": [{"name": "a", "key_env": "PDGW_TEST_UNSET_KEY"}]})
    named = r"gw.yaml: auth\.api_keys\[0\] \(a\): .*PDGW_TEST_UNSET_KEY"
    with pytest.raises(ConfigError, match=named):
        ClientAuth(c)


def test_an_admin_api_open_to_the_network_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"admin\.api_key_file or admin\.api_key_env"):
        AdminAuth(config(tmp_path, server={"host": "0.0.0.0"}))
    AdminAuth(config(tmp_path, server={"host": "127.0.0.1"})).check({})  # loopback: open


def test_the_admin_key_needs_the_bearer_scheme(tmp_path: Path) -> None:
    (tmp_path / "admin.key").write_text("s3cret")
    admin = AdminAuth(
        config(tmp_path, server={"host": "0.0.0.0"}, admin={"api_key_file": "admin.key"})
    )
    admin.check({"authorization": "Bearer s3cret"})
    for headers in [{}, {"authorization": "s3cret"}, {"authorization": "Bearer s3cre"}]:
        with pytest.raises(AuthenticationFailed):
            admin.check(headers)


async def test_backends_get_their_own_key_never_the_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from router.runtime.auth import upstream_credentials
    from router.upstream import Upstreams
    from router.upstream.vllm import PREFILL

    monkeypatch.setenv("VLLM_KEY", "sk-vllm")
    c = config(
        tmp_path,
        upstreams={"credentials": [{"url": "http://prefill:8000", "api_key_env": "VLLM_KEY"}]},
    )
    seen: dict[str, str | None] = {}

    async def handle(request: httpx.Request) -> httpx.Response:
        seen[request.url.host] = request.headers.get("authorization")
        return httpx.Response(200, json={})

    upstreams = Upstreams(
        c.upstreams,
        c.timeouts,
        credentials=upstream_credentials(c),
        transport=HttpxTransport(httpx.MockTransport(handle)),
    )
    for base in ("http://prefill:8000", "http://other:8000"):
        await upstreams.call(PREFILL, "POST", base, "/v1/completions", body={}, read_s=1)
    await upstreams.aclose()
    assert seen == {"prefill": "Bearer sk-vllm", "other": None}


def test_an_unreadable_backend_key_is_named(tmp_path: Path) -> None:
    from router.runtime.auth import upstream_credentials

    c = config(
        tmp_path,
        upstreams={"credentials": [{"url": "http://p:1", "api_key_file": "missing.key"}]},
    )
    with pytest.raises(ConfigError, match=r"upstreams\.credentials\[0\]: cannot read"):
        upstream_credentials(c)


def test_an_empty_key_is_never_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for admin in [{"api_key": ""}, {"api_key": " "}]:
        with pytest.raises(ConfigError, match="an empty key would let anyone in"):
            config(tmp_path, server={"host": "0.0.0.0"}, admin=admin)
    with pytest.raises(ConfigError, match="digest of an empty key"):
        config(tmp_path, auth={"api_keys": [{"name": "a", "sha256": digest("")}]})
    (tmp_path / "blank.key").write_text("\n")
    monkeypatch.setenv("PDGW_TEST_EMPTY_KEY", "")
    for source in [{"key_file": "blank.key"}, {"key_env": "PDGW_TEST_EMPTY_KEY"}]:
        with pytest.raises(ConfigError, match=r"auth\.api_keys\[0\] \(a\)"):
            ClientAuth(config(tmp_path, auth={"api_keys": [{"name": "a", **source}]}))
    auth = ClientAuth(config(tmp_path, auth={"api_keys": [{"name": "a", "sha256": digest("k")}]}))
    for empty in ["Bearer ", "Bearer   ", "bearer"]:
        with pytest.raises(AuthenticationFailed):
            auth.key_name({"authorization": empty})
