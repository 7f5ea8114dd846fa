"""RequestContext as a bare ASGI middleware: the request id in and out, one access line per
API request, and the id on every log line written while the request runs."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from router.http.request_context import RequestContext
from router.telemetry.access import AccessRecord
from router.telemetry.logs import request_id

Message = dict[str, Any]


def scope(path: str = "/v1/chat/completions", headers: list[tuple[bytes, bytes]] | None = None):
    return {"type": "http", "method": "POST", "path": path, "headers": headers or [], "app": None}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    logging.getLogger("pd_gateway.test").warning("inside")
    scope["state"]["access"].model = "m"
    headers = [(b"x-pd-route", b"latency"), (b"x-pd-rule", b"agents")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}", "more_body": False})


class App:
    state = None


async def call(s: dict[str, Any]) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    s["app"] = App()
    await RequestContext(app)(s, receive, send)
    return sent


def returned_id(sent: list[Message]) -> str:
    return dict(sent[0]["headers"])[b"x-request-id"].decode()


async def test_a_client_id_is_kept_and_returned() -> None:
    sent = await call(scope(headers=[(b"x-request-id", b"client-id-42")]))
    assert returned_id(sent) == "client-id-42"


@pytest.mark.parametrize("given", [b"", b"has space", b"x" * 129, "é".encode()])
async def test_an_unusable_client_id_is_replaced(given: bytes) -> None:
    sent = await call(scope(headers=[(b"x-request-id", given)]))
    made = returned_id(sent)
    assert made != given.decode(errors="replace") and len(made) == 32


async def test_one_access_line_with_the_decision(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    sent = await call(scope(headers=[(b"x-request-id", b"abc")]))
    assert returned_id(sent) == "abc"
    (access,) = [r for r in caplog.records if r.name == "pd_gateway.access"]
    record = access.access  # type: ignore[attr-defined]
    assert (record["request_id"], record["model"], record["path"], record["rule"]) == (
        "abc",
        "m",
        "latency",
        "agents",
    )
    assert record["status"] == 200 and record["client_gone"] is False
    public = {field.name for field in dataclasses.fields(AccessRecord)}
    public = {name for name in public if not name.startswith("_")}
    assert set(record) == public | {"itl_ms"}  # the mean gap, from the running totals
    assert request_id.get() == "-", "the id does not leak past its request"


async def test_no_access_line_for_operational_endpoints(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    sent = await call(scope(path="/health"))
    assert returned_id(sent)
    assert not [r for r in caplog.records if r.name == "pd_gateway.access"]


async def test_the_access_line_names_the_client_address(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    await call({**scope(), "client": ("10.1.2.3", 50123)})
    (access,) = [r for r in caplog.records if r.name == "pd_gateway.access"]
    assert access.access["client"] == "10.1.2.3"  # type: ignore[attr-defined]
