"""Classifies each request with the rules (policies/), counting prompt tokens only when a
rule or the guard needs them, in a thread. The guard sees each pool's features as its nodes
last reported them; until they have, as assumed (none, unless `pd-gateway classify` assumes
what the pool's release reports)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from policies import (
    Capabilities,
    ClientObjectiveError,
    Decision,
    ModelCapabilities,
    PromptTokensRequired,
    RuleSet,
    classify,
    features_from_request,
)
from policies.types import Endpoint
from router.config import GatewayConfig, ModelConfig
from router.errors import InvalidRequest
from router.node_lifecycle.facts import NodeFactsBook
from router.tokens.prompt_tokens import PromptCounter
from router.upstream.tilert import RELEASE_FEATURES


def capabilities(
    config: GatewayConfig, assumed: Mapping[str, frozenset[str]] | None = None
) -> Capabilities:
    """`assumed`: each model's pool features before its nodes report theirs (else none)."""
    assumed = assumed or {}
    return Capabilities(
        {
            m.name: ModelCapabilities(
                has_latency_pool=m.latency is not None,
                has_throughput=m.throughput is not None,
                max_seq_len=m.latency.max_seq_len if m.latency else None,
                latency_features=assumed.get(m.name, frozenset()),
            )
            for m in config.models
        }
    )


def release_features(model: ModelConfig) -> frozenset[str]:
    """What every node of the model's pools reports once asked, going by each pool's TileRT
    release (`RELEASE_FEATURES`): the features serving most likely sees."""
    if model.latency is None:
        return frozenset()
    return frozenset.intersection(*(RELEASE_FEATURES[p.tilert] for p in model.latency.pools))


COUNTS_AT_ONCE = 2


def count_cap(rules: RuleSet, model: ModelConfig) -> int | None:
    """A count past which nothing changes a decision: above every rule's prompt_tokens
    bound and the model's max_seq_len (None when no bound exists: count it all)."""
    bounds = [
        bound
        for rule in rules.rules
        if rule.prompt_tokens is not None
        for bound in (rule.prompt_tokens.range.min, rule.prompt_tokens.range.max)
        if bound is not None
    ]
    if model.latency is not None:
        bounds.append(model.latency.max_seq_len)
    return max(bounds) + 1 if bounds else None


class Classifier:
    def __init__(
        self,
        config: GatewayConfig,
        rules: RuleSet,
        counters: Mapping[str, PromptCounter],
        facts: NodeFactsBook | None = None,
        *,
        assumed: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        """`facts`: what the nodes reported (offline, none). `assumed`: each model's pool
        features until its nodes report theirs (by default none)."""
        self._config, self._rules = config, rules
        self._configured = self._capabilities = capabilities(config, assumed)
        self._facts, self._facts_seen = facts or NodeFactsBook(), -1
        self._pool_nodes = {
            m.name: [n.id for n in m.latency.nodes] for m in config.models if m.latency
        }
        self._counters = counters
        self._caps = {m.name: count_cap(rules, m) for m in config.models}
        # Each count holds a tokenizer's working memory: a few at a time, whatever the load.
        self._counting = asyncio.Semaphore(COUNTS_AT_ONCE)

    def assuming(self, features: Mapping[str, frozenset[str]]) -> Classifier:
        """The same classifier, taking `features` as each named model's pool features until
        its nodes report theirs (offline, where no node is asked)."""
        return Classifier(self._config, self._rules, self._counters, self._facts, assumed=features)

    async def decide(
        self,
        body: dict[str, Any],
        *,
        endpoint: Endpoint,
        headers: Mapping[str, str],
        api_key_name: str | None,
        tenant: str | None = None,
    ) -> Decision:
        """`api_key_name` is the caller's verified key name (see `router.runtime.auth`),
        `tenant` who the request is from (`router.tenants`)."""
        if self._facts.version != self._facts_seen:
            self._refresh_features()
        features = features_from_request(
            body, endpoint=endpoint, headers=headers, api_key_name=api_key_name, tenant=tenant
        )
        try:
            try:  # one pass over the rules when the cheap bounds decide, as they mostly do
                return classify(features, self._rules, self._capabilities)
            except PromptTokensRequired:
                counter = self._counters[features.model]
                async with self._counting:
                    features.prompt_tokens = await counter.count(
                        endpoint, body, cap=self._caps[features.model]
                    )
            return classify(features, self._rules, self._capabilities)
        except ClientObjectiveError as exc:
            raise InvalidRequest(str(exc), param=exc.header, code="invalid_objective") from None

    def _refresh_features(self) -> None:
        self._facts_seen = self._facts.version
        models = dict(self._configured.models)
        for name, configured in self._pool_nodes.items():
            unreported = self._configured.models[name].latency_features
            features = self._facts.features(self._facts.members.get(name, configured), unreported)
            models[name] = dataclasses.replace(models[name], latency_features=features)
        self._capabilities = dataclasses.replace(self._configured, models=models)
