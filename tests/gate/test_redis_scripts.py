"""The Redis gate's scripts as shipped: Lua files that name their arguments and build no
key name of their own, called by name; and a key layout that keeps a deployment on one
Redis Cluster slot."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from redis.crc import key_slot

from router.config import RedisGateConfig
from router.gate.circuit_breaker import EXPECTED_BACK
from router.gate.events import UNRECORDED
from router.gate.redis.client import connect
from router.gate.redis.keys import KeyLayout
from router.gate.redis.scripts import NAMES, Scripts, load_sources

# A string literal with a ':' joined to something: how a key name would be built in Lua.
_BUILT_KEY = re.compile(r'"[^"\n]*:[^"\n]*"\s*\.\.|\.\.\s*"[^"\n]*:')


def test_every_script_is_shipped_and_names_its_arguments() -> None:
    sources = load_sources()
    assert set(sources) == set(NAMES)
    assert sources["acquire"][1] == (
        "owner",
        "holder",
        "priority",
        "wait_ms",
        "due_ms",
        "max_queue",
        "share",
    )
    assert sources["state"][1] == ()
    for source, _ in sources.values():
        constants, _ = source.split("-- Prepended to every script", 1)
        assert constants.startswith("local EXPECTED_BACK = {")
        assert "local HOLD_INITIAL_S = 5.0\nlocal HOLD_MIN_SAMPLES = 4\n" in constants


def test_the_scripts_wait_for_the_same_reasons_as_the_python_side() -> None:
    constants = load_sources()["claim"][0].split("\n", 1)[0]
    assert set(re.findall(r'\["([a-z_]+)"\] = true', constants)) == EXPECTED_BACK


def test_no_script_builds_a_key_name() -> None:
    folder = resources.files("router.gate.redis").joinpath("lua")
    for name in (*NAMES, "common"):
        text = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        code = "\n".join(line.split("--")[0] for line in text.splitlines())
        assert not _BUILT_KEY.search(code), name
        assert "KEYS[" not in code or name == "common", name  # only common.lua reads KEYS


async def test_a_call_must_give_exactly_the_scripts_arguments() -> None:
    layout = KeyLayout("p", cluster=False)
    scripts = Scripts(
        connect(RedisGateConfig(url="redis://127.0.0.1:1"), None, max_connections=1),
        layout=layout,
        pool=layout.pool("m", ["n"]),
        replica="r",
        lease_ttl_s=1,
        claim_window_s=1,
        failure_threshold=1,
        node_ids=["n"],
        metrics=UNRECORDED,
        on_state_lost=lambda: None,
        max_calls=1,
    )
    with pytest.raises(TypeError, match="owner"):
        await scripts.run("abandon", owner="o")  # `node` is missing
    with pytest.raises(TypeError, match="holder"):
        await scripts.run("abandon", owner="o", node="", holder="h")


@pytest.mark.parametrize("cluster", [True, False])
def test_a_deployments_keys_share_one_cluster_slot_when_tagged(cluster: bool) -> None:
    layout = KeyLayout("pdgw", cluster=cluster)
    keys = [
        *layout.pool("model-a", ["n1", "n2"]).declared(),
        *layout.pool("model-b", ["n2"]).declared(),
        *layout.node("n1"),
        *layout.node("10.0.0.7:5557"),
        layout.nodes,
    ]
    assert all(k.startswith("{pdgw}:" if cluster else "pdgw:") for k in keys)
    if cluster:
        assert {key_slot(k.encode()) for k in keys} == {key_slot(b"pdgw")}
    else:  # the names an earlier release used for a node's state and lease
        assert layout.node("n1")[:2] == ["pdgw:node:n1", "pdgw:lease:n1"]
