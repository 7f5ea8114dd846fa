"""Request ids and the three-step rid reduction (docs/protocols.md §1.2)."""

import re

import pytest

from sim.ids import engine_request_id, random_base, reduce_rid, response_id


@pytest.mark.parametrize(
    ("request_id", "rid"),
    [
        ("chatcmpl-0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"),
        ("chatcmpl-abc-0a1b2c3d", "abc"),
        ("cmpl-abc-0-0a1b2c3d", "abc"),
        ("cmpl-abc-12", "abc"),
        ("cmpl-abc", "abc"),
        ("abc-deadbeef", "abc"),
        ("req-12ab", "req"),  # hex-looking tail of the client's own id is stripped
        ("chatcmpl-req-12ab-0a1b2c3d", "req-12ab"),
        ("chatcmpl-req-123456789", "req-123456789"),
        ("nodash", "nodash"),
        ("chatcmpl-x-ABCDEF12", "x-ABCDEF12"),  # upper case is not the engine's hex
    ],
)
def test_reduction_table(request_id: str, rid: str) -> None:
    assert reduce_rid(request_id) == rid


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_dash_free_ids_agree_on_both_legs(endpoint: str) -> None:
    base = random_base()
    assert "-" not in base
    engine = engine_request_id(endpoint, base)
    assert reduce_rid(engine) == reduce_rid(response_id(endpoint, base)) == base


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_dashed_client_id_breaks_the_agreement(endpoint: str) -> None:
    base = "req-12ab"
    assert reduce_rid(engine_request_id(endpoint, base)) == "req-12ab"
    assert reduce_rid(response_id(endpoint, base)) == "req"


def test_engine_ids_carry_vllm_suffixes() -> None:
    assert re.fullmatch(r"chatcmpl-b-[0-9a-f]{8}", engine_request_id("chat", "b"))
    assert re.fullmatch(r"cmpl-b-0-[0-9a-f]{8}", engine_request_id("completions", "b"))
    assert engine_request_id("chat", "b", "0000abcd") == "chatcmpl-b-0000abcd"
