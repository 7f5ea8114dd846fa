"""What a TileRT 0.1.6 node checks before it waits for the KV (docs/protocols.md §1.6):
``sampling`` field by field against the engine's capabilities, and ``grammar_spec``.

Refusals are :class:`Refused` with the status and ``{"error", "error_type"}`` body the
real node sends. Written from TileRT's rules, not its code.
"""

from __future__ import annotations

from typing import Any, Literal

GREEDY_TEMPERATURE = 1e-5
MAX_SCHEMA_DEPTH = 64
MAX_SCHEMA_NODES = 1000
MAX_ENUM_VALUES = 10000
GRAMMAR_TYPES = ("json_schema", "json_object", "ebnf", "regex", "structural_tag")
SIM_GRAMMAR_TYPES = ("json_schema", "json_object")


class Refused(Exception):
    """A typed refusal of a /pd/decode request."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type

    def body(self) -> dict[str, str]:
        """The JSON body the node answers with."""
        return {"error": str(self), "error_type": self.error_type}


def _invalid(message: str) -> Refused:
    return Refused(400, "invalid_parameter", message)


# How a sampling field is read, and the value that asks for nothing.
_Kind = Literal["empty", "unset", "number", "flag", "count"]
_Neutral = bool | float | None

# field -> (kind, neutral value, minimum) for the fields no engine supports.
_NEVER: dict[str, tuple[_Kind, _Neutral, int | None]] = {
    "stop_token_ids": ("empty", None, None),
    "min_tokens": ("count", 0, 0),
    "frequency_penalty": ("number", 0.0, None),
    "min_p": ("number", 0.0, None),
    "seed": ("unset", None, None),
    "logit_bias": ("empty", None, None),
    "bad_words": ("empty", None, None),
    "allowed_token_ids": ("empty", None, None),
    "structured_outputs": ("empty", None, None),
    "n": ("count", 1, 1),
    "best_of": ("count", 1, 1),
    "use_beam_search": ("flag", False, None),
    "prompt_logprobs": ("unset", None, None),
    "logprob_token_ids": ("empty", None, None),
    "skip_special_tokens": ("flag", True, None),
}
# field -> (kind, neutral value, capability) for the fields some engines support.
_BY_CAPABILITY: dict[str, tuple[_Kind, _Neutral, str]] = {
    "repetition_penalty": ("number", 1.0, "penalties"),
    "presence_penalty": ("number", 0.0, "penalties"),
    "ignore_eos": ("flag", False, "ignore_eos"),
}


def _loose_float(name: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise _invalid(f"{name} must be a number, got bool")
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise _invalid(f"{name} must be a number, got {raw!r}") from None


def _neutral(name: str, value: Any, kind: _Kind, neutral: _Neutral, minimum: int | None) -> bool:
    if value is None:
        return True
    if kind == "empty":
        return not value
    if kind == "unset":
        return False
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _invalid(f"{name} must be a number, got {type(value).__name__}")
        return float(value) == neutral
    if kind == "flag":
        if not isinstance(value, bool):
            raise _invalid(f"{name} must be a boolean, got {type(value).__name__}")
        return value is neutral
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{name} must be an integer, got {type(value).__name__}")
    if value < (minimum or 0):
        raise _invalid(f"{name} must be >= {minimum or 0}, got {value}")
    return bool(value == neutral)


def is_greedy(sampling: dict[str, Any]) -> bool:
    """Temperature below 1e-5."""
    raw = sampling.get("temperature")
    if raw is None or isinstance(raw, bool):
        return False
    try:
        return float(raw) < GREEDY_TEMPERATURE
    except (TypeError, ValueError):
        return False


def check_sampling(sampling: dict[str, Any], capabilities: dict[str, bool]) -> None:
    """Refuse a sampling dict the engine cannot honour for the whole reply."""
    for name in ("temperature", "top_p"):
        if sampling.get(name) is not None:
            value = _loose_float(name, sampling[name])
            if value < 0.0:
                raise _invalid(f"{name} must be >= 0.0, got {value}")
    if sampling.get("top_k") is not None:
        value = _loose_float("top_k", sampling["top_k"])
        if value != int(value):
            raise _invalid(f"top_k must be an integer, got {sampling['top_k']!r}")
    greedy = is_greedy(sampling)
    for name, (kind, neutral, minimum) in _NEVER.items():
        if name not in sampling or _neutral(name, sampling[name], kind, neutral, minimum):
            continue
        if name == "seed" and greedy:
            continue
        raise Refused(
            501, "capability_unavailable", f"{name} is not supported by the TileRT decode stage"
        )
    for name, (kind, neutral, capability) in _BY_CAPABILITY.items():
        if name not in sampling or _neutral(name, sampling[name], kind, neutral, None):
            continue
        if not capabilities.get(capability, False):
            raise Refused(
                501,
                "capability_unavailable",
                f"{name} is not supported by the decode node serving this pool",
            )


def _walk(node: Any, depth: int, counts: dict[str, int], path: str) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        where = path or "<root>"
        raise Refused(
            400, "invalid_grammar", f"json_schema nests deeper than {MAX_SCHEMA_DEPTH} at {where}"
        )
    if isinstance(node, list):
        for index, item in enumerate(node):
            _walk(item, depth, counts, f"{path}[{index}]")
        return
    if not isinstance(node, dict):
        return
    counts["nodes"] += 1
    if counts["nodes"] > MAX_SCHEMA_NODES:
        raise Refused(400, "invalid_grammar", f"json_schema has over {MAX_SCHEMA_NODES} subschemas")
    enum = node.get("enum")
    if isinstance(enum, list):
        counts["enums"] += len(enum)
        if counts["enums"] > MAX_ENUM_VALUES:
            raise Refused(
                400, "invalid_grammar", f"json_schema has over {MAX_ENUM_VALUES} enum values"
            )
    for key, child in node.items():
        if key not in ("enum", "const", "examples", "default") and isinstance(child, dict | list):
            _walk(child, depth + 1, counts, f"{path}.{key}" if path else key)


def check_grammar(spec: dict[str, Any] | None, supported: bool) -> None:
    """Refuse a grammar the node cannot apply (an engine without grammars refuses any)."""
    if spec is None:
        return
    if not supported:
        raise Refused(501, "grammar_unsupported", "constrained decoding is not supported")
    kind = spec.get("type")
    if kind not in GRAMMAR_TYPES:
        raise Refused(400, "invalid_grammar", f"unsupported grammar spec type: {kind!r}")
    if kind not in SIM_GRAMMAR_TYPES:
        raise Refused(501, "grammar_unsupported", f"{kind} grammars are not supported")
    if spec:
        _walk(spec.get("value"), 0, {"nodes": 0, "enums": 0}, "")


def effective_sampling(protocol: str, sampling: dict[str, Any] | None) -> dict[str, Any]:
    """What the engine would sample with; ``top_k`` None means off.

    0.1.5 defaults: top_p 0.95, top_k 256; 0.1.6: top_p 1.0, top_k off (any value
    outside 1..255). Greedy (temperature < 1e-5) is top_k 1 on both.
    """
    values = sampling or {}
    try:
        temperature = float(values.get("temperature", 1.0))
        ignore_eos = bool(values.get("ignore_eos"))
        if temperature < GREEDY_TEMPERATURE:
            return {
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": 1,
                "greedy": True,
                "ignore_eos": ignore_eos,
            }
        if protocol == "0.1.5":
            top_p = float(values.get("top_p", 0.95))
            top_k: int | None = int(values.get("top_k", 256))
        else:
            raw_p = values.get("top_p")
            top_p = 1.0 if raw_p is None else float(raw_p)
            raw_k = values.get("top_k")
            top_k = None if raw_k is None else int(raw_k)
            if top_k is not None and not 1 <= top_k <= 255:
                top_k = None
    except (TypeError, ValueError) as exc:
        return {"error": str(exc)}
    return {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "greedy": False,
        "ignore_eos": ignore_eos,
    }
