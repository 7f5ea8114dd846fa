"""Client keys and request ids through the real OpenAI SDK: a wrong key is a 401 that
reaches no backend, a right one is served under its name's rule, and every answer names
its request."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from router.runtime.auth import digest
from sim.stack import SimStack
from tests.support.classify_fixtures import proxy_throughput
from tests.support.deployment import directive, latency_model, sim_get
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("fresh_sims")

RULES = {
    "default": {"name": "standard", "path": "throughput"},
    "rules": [{"name": "premium", "match": {"api_key_name": "premium-acme"}, "path": "latency"}],
}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=1, prefills=1, proxy=True, model="ds", node_args=["--step-ms", "1"])


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    models = [latency_model(stack, "ds", throughput=proxy_throughput(stack))]
    with start_gateway(
        tmp_path_factory,
        models,
        classification={"rules": RULES},
        auth={
            "api_keys": [
                {"name": "premium-acme", "sha256": digest("sk-premium")},
                {"name": "team-blue", "sha256": digest("sk-blue")},
            ]
        },
    ) as running:
        yield running


def client(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)


def ask(sdk: openai.OpenAI, **headers: str) -> openai.APIResponse:  # type: ignore[type-arg]
    return sdk.chat.completions.with_raw_response.create(
        model="ds",
        messages=[{"role": "user", "content": directive("ok")}],
        max_tokens=4,
        extra_headers=headers,
    )


def backend_calls(stack: SimStack) -> int:
    assert stack.proxy is not None
    prefill = sim_get(stack.prefills[0].url, "/sim/requests")["requests"]
    return len(prefill) + len(sim_get(stack.proxy.url, "/sim/requests")["requests"])


def test_a_wrong_key_is_a_401_that_reaches_no_backend(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    with client(gateway, "sk-wrong") as sdk, pytest.raises(openai.AuthenticationError) as denied:
        ask(sdk)
    assert denied.value.status_code == 401
    assert denied.value.code == "invalid_api_key"
    assert denied.value.response.headers["x-request-id"]
    assert backend_calls(stack) == 0


def test_the_keys_name_decides_the_rule_and_a_header_cannot_fake_it(
    gateway: GatewayProcess,
) -> None:
    with client(gateway, "sk-premium") as sdk:
        assert ask(sdk).headers["x-pd-rule"] == "premium"
    with client(gateway, "sk-blue") as sdk:
        faked = ask(sdk, **{"x-pd-api-key-name": "premium-acme"})
        assert faked.headers["x-pd-rule"] == "standard"


def test_the_request_id_is_the_clients_or_a_new_one(gateway: GatewayProcess) -> None:
    with client(gateway, "sk-blue") as sdk:
        given = ask(sdk, **{"x-request-id": "client-chosen-7"})
        assert given.headers["x-request-id"] == "client-chosen-7"
        made = ask(sdk)
        assert len(made.headers["x-request-id"]) == 32
        assert made.parse()._request_id == made.headers["x-request-id"]
