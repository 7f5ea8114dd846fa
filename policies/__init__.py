"""Request classification: rules file, matcher and capability guard. Pure: no I/O.

rules = load_rules("rules.yaml")                       # or parse_rules(inline_dict)
features = features_from_request(body, endpoint="chat", headers=h, api_key_name=k)
try:
    decision = classify(features, rules, capabilities)  # the cheap bounds mostly decide
except PromptTokensRequired:
    features.prompt_tokens = ...                        # counted off the event loop
    decision = classify(features, rules, capabilities)
"""

from policies.capabilities import (
    Capabilities,
    ModelCapabilities,
    TokenBounds,
    TokenRange,
    max_token_bytes,
)
from policies.decision import Decision
from policies.errors import PolicyError, PromptTokensRequired, RulesError
from policies.features import DecodingOptions, RequestFeatures, features_from_request
from policies.guard import NO_THROUGHPUT_PATH, RerouteReason
from policies.matcher import classify, needs_prompt_tokens
from policies.objectives import WAYS, ClientObjectiveError, Objective, OnMiss, Way
from policies.rules import load_rules, parse_rules
from policies.ruleset import Action, Rule, RuleSet
from policies.types import Endpoint, OnSaturation, Path

__all__ = [
    "NO_THROUGHPUT_PATH",
    "WAYS",
    "Action",
    "Capabilities",
    "ClientObjectiveError",
    "Decision",
    "DecodingOptions",
    "Endpoint",
    "ModelCapabilities",
    "Objective",
    "OnMiss",
    "OnSaturation",
    "Path",
    "PolicyError",
    "PromptTokensRequired",
    "RequestFeatures",
    "RerouteReason",
    "Rule",
    "RuleSet",
    "RulesError",
    "TokenBounds",
    "TokenRange",
    "Way",
    "classify",
    "features_from_request",
    "load_rules",
    "max_token_bytes",
    "needs_prompt_tokens",
    "parse_rules",
]
