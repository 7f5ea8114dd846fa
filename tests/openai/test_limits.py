"""Request limits: every bound names itself, nothing within the bounds is refused, and the
checks stay linear however hostile the body."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.config import LimitsConfig
from router.errors import InvalidRequest
from router.openai.limits import check_limits, check_token_ids, strip_transfer_params

LIMITS = LimitsConfig()
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**CHAT, "metadata": nested(LIMITS.max_json_depth)}, "max_json_depth"),
        ({**CHAT, "chat_template_kwargs": nested(500)}, "max_json_depth"),
        ({**CHAT, "messages": CHAT["messages"] * (LIMITS.max_messages + 1)}, "max_messages"),
        ({**CHAT, "tools": [{"type": "function"}] * (LIMITS.max_tools + 1)}, "max_tools"),
        ({**CHAT, "stop": ["x"] * (LIMITS.max_stop_strings + 1)}, "max_stop_strings"),
        ({**CHAT, "stop": "y" * (LIMITS.max_stop_chars + 1)}, "max_stop_chars"),
        ({**CHAT, "stop": ["ok", "z" * (LIMITS.max_stop_chars + 1)]}, "max_stop_chars"),
        ({**CHAT, "stop_token_ids": [1] * (LIMITS.max_stop_strings + 1)}, "max_stop_strings"),
        ({"model": "m", "prompt": ["p"] * (LIMITS.max_prompts + 1)}, "max_prompts"),
    ],
)
def test_each_limit_names_itself(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_limits(body, LIMITS)
    assert refused.value.status == 400
    assert refused.value.code == "limit_exceeded"
    assert f"limits.{field}" in refused.value.message


def test_a_body_at_every_limit_passes() -> None:
    body = {
        **CHAT,
        "messages": CHAT["messages"] * LIMITS.max_messages,
        "tools": [{"type": "function"}] * LIMITS.max_tools,
        "stop": ["s" * LIMITS.max_stop_chars] * LIMITS.max_stop_strings,
        "metadata": nested(LIMITS.max_json_depth - 2),
    }
    check_limits(body, LIMITS)


def test_a_long_token_id_prompt_is_one_prompt() -> None:
    check_limits({"model": "m", "prompt": list(range(100_000))}, LIMITS)


# What orjson parses: integers past 64 bits arrive as floats.
SCALARS = st.none() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=3)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=400,
)


@given(JSON)
def test_whatever_passes_the_depth_limit_can_be_re_encoded(value: Any) -> None:
    body = {**CHAT, "metadata": value}
    try:
        check_limits(body, LimitsConfig(max_json_depth=200))
    except InvalidRequest:
        return
    orjson.loads(orjson.dumps(body))


def test_the_ceiling_of_the_depth_limit_is_still_encodable() -> None:
    body = {**CHAT, "metadata": nested(197)}
    check_limits(body, LimitsConfig(max_json_depth=200))
    assert orjson.loads(orjson.dumps(body)) == body


def test_transfer_params_are_stripped_from_every_carrier() -> None:
    body = {
        **CHAT,
        "kv_transfer_params": {"tilert_host": "evil"},
        "KV_Transfer_Params": {"tilert_host": "evil"},
        "vllm_xargs": {"kv_transfer_params": {"remote_host": "evil"}, "keep": 1},
    }
    strip_transfer_params(body)
    assert body == {**CHAT, "vllm_xargs": {"keep": 1}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "prompt": [-1]}, "prompt"),
        ({"model": "m", "prompt": [5, 1000]}, "prompt"),
        ({"model": "m", "prompt": [[1], [2, 1000]]}, "prompt"),
        ({**CHAT, "stop_token_ids": [999, 1000]}, "stop_token_ids"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_token_ids(body, vocab_size=1000)
    assert refused.value.param == param
    assert "vocabulary" in refused.value.message


def test_token_ids_inside_the_vocabulary_pass() -> None:
    check_token_ids({"model": "m", "prompt": [0, 999], "stop_token_ids": [999]}, vocab_size=1000)
    check_token_ids({"model": "m", "prompt": "text"}, vocab_size=1000)
