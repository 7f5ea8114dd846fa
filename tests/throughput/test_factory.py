"""The factory turns each throughput configuration into its own mode type."""

from __future__ import annotations

import pytest

from router.config import PrefillEngineConfig, ProxyConfig, PullConfig, PushConfig
from router.throughput import make_throughput_path
from router.throughput.proxy import ProxyPath
from router.throughput.pull import PullPath
from router.throughput.push import PushPath

from .support import Upstreams, balancers

ENGINE = PrefillEngineConfig(
    url="http://p:8000", engine_id="e", side_channel_host="p", side_channel_port=5600
)


@pytest.mark.parametrize(
    ("config", "kind", "pools"),
    [
        (ProxyConfig(mode="proxy", urls=["http://x:1"]), ProxyPath, {"proxy"}),
        (
            PullConfig(mode="pull", prefill=["http://p:1"], decode=["http://d:1"]),
            PullPath,
            {"prefill", "decode"},
        ),
        (
            PushConfig(mode="push", prefill=[ENGINE], decode=["http://d:1"]),
            PushPath,
            {"prefill", "decode"},
        ),
    ],
)
async def test_each_mode_is_its_own_type(config: object, kind: type, pools: set[str]) -> None:
    path = make_throughput_path(config, upstreams=Upstreams().pool())  # type: ignore[arg-type]
    assert type(path) is kind
    assert set(balancers(path)) == pools


async def test_anything_else_is_refused() -> None:
    with pytest.raises(TypeError, match="not a throughput configuration"):
        make_throughput_path(object(), upstreams=Upstreams().pool())  # type: ignore[arg-type]
