"""Log lines name their request, as text or as JSON lines."""

from __future__ import annotations

import logging

import orjson
import pytest

from router.telemetry import logs


@pytest.fixture
def restore_root():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_the_request_id_and_access_fields(
    restore_root: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("info", "json")
    token = logs.request_id.set("req-1")
    try:
        logging.getLogger("pd_gateway.access").info("done", extra={"access": {"status": 200}})
    finally:
        logs.request_id.reset(token)
    logging.getLogger("pd_gateway").info("outside")
    first, second = (orjson.loads(line) for line in capsys.readouterr().err.splitlines())
    assert (first["request_id"], first["message"], first["status"]) == ("req-1", "done", 200)
    assert first["level"] == "info" and first["ts"].endswith("Z")
    assert second["request_id"] == "-"


def test_text_lines_name_the_request(
    restore_root: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("warning", "text")
    token = logs.request_id.set("req-2")
    try:
        logging.getLogger("pd_gateway").warning("slow", extra={"access": {"node": "n1"}})
        logging.getLogger("pd_gateway").info("hidden below the level")
    finally:
        logs.request_id.reset(token)
    (line,) = capsys.readouterr().err.splitlines()
    assert "[req-2] slow node=n1" in line
