"""Classifies each request with the rules (policies/), counting prompt tokens only when a
rule or the guard needs them, in a thread."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import (
    Capabilities,
    Decision,
    ModelCapabilities,
    RuleSet,
    classify,
    features_from_request,
    needs_prompt_tokens,
)
from policies.types import Endpoint
from router.config import GatewayConfig
from router.prompt_tokens import PromptCounter


def capabilities(config: GatewayConfig) -> Capabilities:
    return Capabilities(
        {
            m.name: ModelCapabilities(
                has_latency_pool=m.latency is not None,
                has_throughput=m.throughput is not None,
                max_seq_len=m.latency.max_seq_len if m.latency else None,
            )
            for m in config.models
        }
    )


class Classifier:
    def __init__(
        self, config: GatewayConfig, rules: RuleSet, counters: Mapping[str, PromptCounter]
    ) -> None:
        self._rules = rules
        self._capabilities = capabilities(config)
        self._counters = counters

    async def decide(
        self,
        body: dict[str, Any],
        *,
        endpoint: Endpoint,
        headers: Mapping[str, str],
        api_key_name: str | None,
    ) -> Decision:
        """`api_key_name` is the caller's verified key name (see `router.auth`)."""
        features = features_from_request(
            body, endpoint=endpoint, headers=headers, api_key_name=api_key_name
        )
        if needs_prompt_tokens(features, self._rules, self._capabilities):
            counter = self._counters[features.model]
            features.prompt_tokens = await counter.count(endpoint, body)
        return classify(features, self._rules, self._capabilities)
