"""A path's selection: the weights of its sets' scorers, configured per model and path."""

from __future__ import annotations

from collections import Counter

import pytest

from router.config import ModelConfig, SelectionConfig
from router.runtime.models import path_selection
from router.selection import Affinity, AffinityKeys, PathSelection, Weights, default_set
from router.selection.affinity import block_hashes

A, B, C = "http://a", "http://b", "http://c"


def test_random_alone_spreads_requests_over_every_server() -> None:
    servers = default_set([A, B, C], weights=Weights(load=0, queue=0, random=1))
    with servers.hold(A), servers.hold(A), servers.hold(A):  # load has no say
        picks = Counter(servers.pick() for _ in range(300))
    assert {choice.url for choice in picks} == {A, B, C}
    assert {choice.reason for choice in picks} == {"random"}
    assert min(picks.values()) > 60


def test_a_weight_of_zero_leaves_its_scorer_out() -> None:
    keys = AffinityKeys(lambda endpoint, body: list(range(64)), block_size=16)
    selection = PathSelection(keys, Weights(prefix=0))
    servers = selection.server_set([A, B], "s")
    request = Affinity(block_hashes(list(range(64))), tokens=64)
    with servers.hold(B, request):
        pass
    # B holds the prompt, but prefix weighs nothing: the tie rotates.
    assert {servers.pick(request=request).reason for _ in range(2)} == {"rotation"}
    assert [s.name for s in keys.scorers(Weights(prefix=0))] == ["session"]
    assert [s.name for s in keys.scorers(Weights(session=0))] == ["prefix"]


async def test_a_set_that_is_not_request_aware_asks_nothing_of_the_request() -> None:
    asked = []

    def prompt_ids(endpoint: str, body: dict[str, object]) -> list[int]:
        asked.append(endpoint)
        return list(range(64))

    selection = PathSelection(AffinityKeys(prompt_ids))
    proxies = selection.server_set([A, B], "proxy", request_aware=False)
    assert await selection.affinity([proxies], "chat", {}, {}) is None
    prefills = selection.server_set([A, B], "prefill")
    offered = await selection.affinity([proxies, prefills], "chat", {"user": "u"}, {})
    assert offered is not None and offered.tokens == 64 and offered.session == "u"
    assert asked == ["chat"]


MODEL = {
    "name": "m",
    "tokenizer": "deepseek",
    "latency": {
        "prefill": ["http://p:8000"],
        "nodes": [{"host": "n", "ctrl_port": 1, "http_port": 2}],
        "selection": {"weights": {"queue": 0}},
    },
    "throughput": {
        "mode": "proxy",
        "urls": ["http://v:8000"],
        "selection": {"prefix_affinity": False, "weights": {"random": 1, "load": 0}},
    },
    "selection": {"block_size": 32, "weights": {"session": 2}},
}


def test_a_path_changes_only_the_fields_it_names() -> None:
    model = ModelConfig.model_validate(MODEL)
    latency = model.selection_of("latency")
    assert (latency.block_size, latency.prefix_affinity) == (32, True)
    assert latency.weights.model_dump() == {
        "load": 1.0,
        "queue": 0.0,
        "prefix": 2.0,
        "session": 2.0,
        "random": 0.0,
    }
    native = model.selection_of("throughput")
    assert (native.block_size, native.prefix_affinity) == (32, False)
    assert (native.weights.load, native.weights.random, native.weights.session) == (0, 1, 2)
    bare = ModelConfig.model_validate({**MODEL, "throughput": None, "selection": {}})
    assert bare.selection_of("throughput") == SelectionConfig()


@pytest.mark.parametrize("weights", [{"load": -1}, {"prefix": 1000}, {"lru": 1}])
def test_weights_are_bounded_and_named(weights: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="weights"):
        ModelConfig.model_validate({**MODEL, "selection": {"weights": weights}})


async def test_the_runtime_builds_each_path_from_its_selection() -> None:
    class Prompts:
        def ids_now(self, endpoint: str, body: dict[str, object]) -> list[int]:
            return list(range(64))

    on = path_selection(SelectionConfig(), Prompts())  # type: ignore[arg-type]
    off = path_selection(
        SelectionConfig.model_validate({"prefix_affinity": False, "weights": {"random": 1}}),
        Prompts(),  # type: ignore[arg-type]
    )
    assert (on.weights, off.weights) == (Weights(), Weights(random=1))
    sets = [on.server_set([A, B], "s")]
    assert (await on.affinity(sets, "chat", {}, {})) == Affinity(
        block_hashes(list(range(64))), tokens=64
    )
    offered = await off.affinity([off.server_set([A, B], "s")], "chat", {"user": "u"}, {})
    assert offered == Affinity(session="u")
