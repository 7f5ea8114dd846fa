"""Why `pd-gateway serve` could not start: one line for the operator and the exit status
that says whose problem it is (2: the configuration, 1: the machine or the network)."""

from __future__ import annotations

import logging
from typing import Any

from uvicorn.lifespan.on import LifespanOn

from router.config import ConfigError

CONFIGURATION_STATUS = 2
ENVIRONMENT_STATUS = 1


class StartupFailure(Exception):
    """The gateway could not start; the message is `<what>: <problem>`."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def failure_of(exc: BaseException) -> StartupFailure:
    """The failure of the application's start-up that raised `exc`."""
    if isinstance(exc, ConfigError):
        return StartupFailure(_one_line(str(exc)), CONFIGURATION_STATUS)
    if isinstance(exc, OSError) and exc.strerror:
        problem = exc.strerror if not exc.filename else f"{exc.filename}: {exc.strerror}"
    else:
        problem = _one_line(str(exc)) or type(exc).__name__
    return StartupFailure(f"start-up: {type(exc).__name__}: {problem}", ENVIRONMENT_STATUS)


def cannot_listen(where: str, exc: OSError) -> StartupFailure:
    return StartupFailure(f"cannot listen on {where}: {exc.strerror or exc}", ENVIRONMENT_STATUS)


class QuietLifespan(LifespanOn):
    """uvicorn's lifespan, without the traceback it logs when the start-up fails: the
    failure is reported once, as a `StartupFailure`, by whoever runs the server."""

    async def send(self, message: Any) -> None:
        if message["type"] == "lifespan.startup.failed":
            message = {"type": message["type"], "message": ""}
        await super().send(message)


def quiet_startup_log() -> None:
    """uvicorn's own "Application startup failed. Exiting." says nothing the one error line
    does not."""
    logging.getLogger("uvicorn.error").addFilter(_drop_startup_failed)


def _drop_startup_failed(record: logging.LogRecord) -> bool:
    return record.getMessage() != "Application startup failed. Exiting."


def _one_line(text: str) -> str:
    return " ".join(text.split())
