"""Logging: every line carries the request it belongs to, as text or as JSON lines.

The request id lives in a context variable set by `RequestContext` for the request's
task; a filter copies it onto each record, so any module's `log.warning(...)` names its
request without passing it around. Access records carry their fields as `extra={"access":
{...}}` and become JSON keys (or `key=value` pairs in text).
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from typing import Any, Literal

import orjson

LogFormat = Literal["text", "json"]
LEVELS = ("critical", "error", "warning", "info", "debug")

request_id: ContextVar[str] = ContextVar("request_id", default="-")
_in_a_worker = False  # one of several gateway processes (`server.workers`): lines name it


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if _in_a_worker:
            line["worker"] = record.process
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            line.update(access)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        worker = " worker=%(process)d" if _in_a_worker else ""
        super().__init__(f"%(asctime)s %(levelname)s %(name)s{worker} [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            text += " " + " ".join(f"{k}={v}" for k, v in access.items() if v is not None)
        return text


def name_this_worker() -> None:
    """From now on (this configuration and the next) every line names this process."""
    global _in_a_worker
    _in_a_worker = True
    for handler in logging.getLogger().handlers:
        json = isinstance(handler.formatter, JsonFormatter)
        handler.setFormatter(JsonFormatter() if json else TextFormatter())


def configure(level: str, fmt: LogFormat) -> None:
    """Root logging to stderr in `fmt`; httpx's one line per upstream call is silenced."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
