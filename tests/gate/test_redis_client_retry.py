"""A command whose connection was found closed while redis-py wrote it is sent once more;
a failure after its write never is. The failures are raised inside redis-py's own
connection, by a transport closed under it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest
from redis.asyncio import Connection, RedisCluster
from redis.exceptions import ConnectionError

from router.gate.redis.client import GateRedis, RedisClient

COMMAND = b"*2\r\n$7\r\nEVALSHA\r\n$1\r\n0\r\n"


class Transport:
    def __init__(self, closing: bool) -> None:
        self.closing = closing

    def is_closing(self) -> bool:
        return self.closing


class Writer:
    """A stream writer: it takes every write, or its transport is closed and raises as
    CPython's does after `connection_lost` (redis-py issue 4287), or as a writer another
    caller let go of does. redis-py 8 asks the transport first, and raises its own
    ConnectionError; older releases write, and meet the transport's error."""

    def __init__(self, closed: Exception | None = None) -> None:
        self.closed = closed
        self.written: list[bytes] = []
        self.transport = Transport(closing=closed is not None)

    def writelines(self, data: list[bytes]) -> None:
        if self.closed is not None:
            self.transport.closing = True  # closed under the write itself
            raise self.closed
        self.written.extend(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


class ClosingUnderWrite(Writer):
    """Its transport is open when asked, and closed by the time the write reaches it."""

    def __init__(self, closed: Exception) -> None:
        super().__init__(closed)
        self.transport.closing = False


class ResetAfterWrite(Writer):
    """Takes the write, then the peer resets the connection: the command may have run."""

    async def drain(self) -> None:
        raise ConnectionResetError(104, "Connection reset by peer")


OPENED: list[Connection] = []


def connection(writer: Writer) -> Connection:
    """A redis-py connection that counts as open, writing to `writer`."""
    opened = Connection()
    opened._reader = MagicMock()
    opened._writer = writer  # type: ignore[assignment]
    OPENED.append(opened)
    return opened


@pytest.fixture(autouse=True)
async def closed_connections() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().disconnect()


def attempts(*outcomes: Callable[[], Awaitable[Any]]) -> tuple[Callable[[Any], Any], list[int]]:
    """A command that runs the next of `outcomes` on each attempt; and the attempts' count."""
    made: list[int] = []

    async def command(_: RedisClient) -> Any:
        made.append(1)
        return await outcomes[len(made) - 1]()

    return command, made


async def sent(opened: Connection) -> str:
    await opened.send_packed_command(COMMAND, check_health=False)
    return "OK"


@pytest.mark.parametrize(
    "closed",
    [
        TypeError("'NoneType' object is not callable"),
        AttributeError("'NoneType' object has no attribute '_add_writer'"),
        AttributeError("'NoneType' object has no attribute 'writelines'"),
    ],
)
async def test_a_command_that_could_not_be_written_is_sent_once_more(closed: Exception) -> None:
    broken = connection(Writer(closed))
    writer = Writer()
    command, made = attempts(lambda: sent(broken), lambda: sent(connection(writer)))
    reached: list[bool] = []
    redis = GateRedis(MagicMock(), reached=reached.append)
    assert await redis.run(command) == "OK"
    assert len(made) == 2 and writer.written == [COMMAND]
    assert reached == [False, True]


async def test_a_transport_closed_under_the_write_itself_is_sent_once_more() -> None:
    writer = Writer()
    broken = connection(ClosingUnderWrite(TypeError("'NoneType' object is not callable")))
    command, made = attempts(lambda: sent(broken), lambda: sent(connection(writer)))
    assert await GateRedis(MagicMock()).run(command) == "OK"
    assert len(made) == 2 and writer.written == [COMMAND]


async def test_a_socket_error_during_the_write_is_not_retried() -> None:
    reset = ResetAfterWrite()
    command, made = attempts(lambda: sent(connection(reset)), lambda: sent(connection(Writer())))
    with pytest.raises(ConnectionError):
        await GateRedis(MagicMock()).run(command)
    assert len(made) == 1 and reset.written == [COMMAND]


async def test_a_failure_after_the_write_is_not_retried() -> None:
    writer = Writer()

    async def read_broken() -> str:
        await sent(connection(writer))
        raise AttributeError("'NoneType' object has no attribute 'read_response'")

    command, made = attempts(read_broken, lambda: sent(connection(Writer())))
    with pytest.raises(ConnectionError, match="connection lost"):
        await GateRedis(MagicMock()).run(command)
    assert len(made) == 1 and writer.written == [COMMAND]


async def test_a_connection_error_is_never_retried() -> None:
    async def lost() -> str:
        raise ConnectionError("Error 104 while writing to socket. Connection reset by peer.")

    command, made = attempts(lost, lambda: sent(connection(Writer())))
    with pytest.raises(ConnectionError, match="reset by peer"):
        await GateRedis(MagicMock()).run(command)
    assert len(made) == 1


async def test_a_second_failed_write_is_not_retried() -> None:
    closed = TypeError("'NoneType' object is not callable")
    command, made = attempts(
        lambda: sent(connection(Writer(closed))), lambda: sent(connection(Writer(closed)))
    )
    with pytest.raises(ConnectionError, match=r"(?i)connection (lost|closed)"):
        await GateRedis(MagicMock()).run(command)
    assert len(made) == 2


async def test_a_cluster_learns_its_slots_again_before_the_second_attempt() -> None:
    cluster = MagicMock(spec=RedisCluster)
    cluster.initialize = AsyncMock()
    order: list[str] = []
    cluster.initialize.side_effect = lambda: order.append("initialize")

    async def write(opened: Connection) -> str:
        order.append("command")
        return await sent(opened)

    closed = AttributeError("'NoneType' object has no attribute 'writelines'")
    command, _ = attempts(
        lambda: write(connection(Writer(closed))), lambda: write(connection(Writer()))
    )
    assert await GateRedis(cluster).run(command) == "OK"
    assert order == ["initialize", "command", "initialize", "command"]
