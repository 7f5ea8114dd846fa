"""The TileRT KV connector's sending side, played by the prefill server, as TileRT 0.1.5 or
0.1.6 has it (docs/protocols.md §1.3, §1.5, §1.6).

One control connection per sender rank. Both versions read the hello and check it, send
the request, write the KV (here: the planned output over the node's simulated data
plane, rank 0), spend the transfer time, send done.

* **0.1.5** does not read the node's answer: a refused sender writes and sends done all
  the same (the write lands in the node's single buffer: corruption). It checks magic,
  layout version, transport and ``max_seq_len`` only.
* **0.1.6** also requires ``protocol_version`` 2 and the node's ``senders`` to equal its
  own; it reads the answer to every request, writes only once accepted, and retries
  ``busy`` / ``cancelling`` refusals (5 attempts, backoff 0.2, 0.4, 0.8, 1.6 s, times
  ``backoff_scale``). A mismatched hello is not retried: nothing is transferred.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from sim.framing import FrameError, close_quietly, read_frame, write_frame

ADMISSION_ATTEMPTS = 5
ADMISSION_BACKOFF_S = 0.2
_TRANSIENT = frozenset({"busy", "cancelling"})


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One rid's transfer to one node, for every sender rank."""

    host: str
    ctrl_port: int
    rid: str
    seq_len: int
    last_prompt_token: int
    sampling: dict[str, Any] | None
    output_ids: list[int]
    transfer_s: float
    send_done: bool
    layout_version: int
    transport: str
    protocol: str = "0.1.6"
    senders: int = 1
    attempts: int = ADMISSION_ATTEMPTS
    backoff_scale: float = 1.0

    @property
    def admission_window_s(self) -> float:
        """How long retries may still come after the first refusal (sent in 0.1.6 requests)."""
        return ADMISSION_BACKOFF_S * self.backoff_scale * (2.0 ** max(0, self.attempts - 1) - 1)


@dataclass(slots=True)
class RankResult:
    """How one rank's transfer ended."""

    outcome: str
    attempts: int = 1
    refusal: dict[str, Any] | None = None


def _refusal_outcome(message: dict[str, Any] | None) -> str:
    error = None if message is None else message.get("error")
    if error is None:
        return "complete"
    if error == "seq_len exceeds max_seq_len":
        return "refused_seq_len"
    if error in ("busy", "cancelling", "duplicate_rank"):
        return f"refused_{error}"
    return "protocol_error"


async def _send_plan(address: dict[str, Any], job: TransferJob, rank: int) -> None:
    reader, writer = await asyncio.open_connection(address["host"], int(address["port"]))
    try:
        await write_frame(writer, {"rid": job.rid, "rank": rank, "output_ids": job.output_ids})
        await read_frame(reader)
    finally:
        await close_quietly(writer)


async def _write_kv(hello: dict[str, Any], job: TransferJob, rank: int) -> None:
    data_plane = hello.get("sim_data_plane")
    if isinstance(data_plane, dict) and rank == 0:
        await _send_plan(data_plane, job, rank)


def _hello_problem(hello: dict[str, Any] | None, job: TransferJob) -> str | None:
    """What the connector's hello checks find wrong, or None."""
    if hello is None or hello.get("magic") != "tilert-pd":
        return "hello_mismatch"
    if job.protocol == "0.1.6":
        if hello.get("protocol_version", 1) != 2:
            return "protocol_mismatch"
        if hello.get("layout_version") != job.layout_version:
            return "hello_mismatch"
        if int(hello.get("senders", 1) or 1) != job.senders:
            return "senders_mismatch"
    elif hello.get("layout_version") != job.layout_version:
        return "hello_mismatch"
    if hello.get("transport") != job.transport:
        return "hello_mismatch"
    if job.seq_len > int(hello.get("max_seq_len", 0)):
        return "seq_len_exceeds"
    return None


def _request(job: TransferJob, rank: int) -> dict[str, Any]:
    request: dict[str, Any] = {
        "rid": job.rid,
        "rank": rank,
        "seq_len": job.seq_len,
        "last_prompt_token": job.last_prompt_token,
        "sampling": job.sampling,
    }
    if job.protocol == "0.1.6":
        request["admission_window_s"] = job.admission_window_s
    return request


async def _greet(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, job: TransferJob, rank: int
) -> dict[str, Any] | RankResult:
    """Read and check the node's hello, then send the request: the hello, or why not."""
    hello = await read_frame(reader)
    problem = _hello_problem(hello, job)
    if problem is not None:
        return RankResult(problem)
    assert hello is not None
    await write_frame(writer, _request(job, rank))
    return hello


async def _exchange_v15(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, job: TransferJob, rank: int
) -> RankResult:
    hello = await _greet(reader, writer, job, rank)
    if isinstance(hello, RankResult):
        return hello
    # 0.1.5 never reads the answer before writing: a refusal changes nothing here.
    await _write_kv(hello, job, rank)
    await asyncio.sleep(job.transfer_s)
    if not job.send_done:
        return RankResult("no_done")
    try:
        await write_frame(writer, {"done": True, "rid": job.rid, "rank": rank})
    except (ConnectionError, OSError):
        pass  # a refusal closed the connection; the answer below says so
    answer = await read_frame(reader)
    if answer is not None and answer.get("accepted") is True:
        answer = None  # a 0.1.6 node's acceptance, unread by a 0.1.5 connector
    outcome = _refusal_outcome(answer)
    if outcome == "refused_busy":
        outcome = "written_while_busy"  # the write went into the node's busy buffer
    return RankResult(outcome, refusal=answer)


async def _exchange_v16(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, job: TransferJob, rank: int
) -> RankResult:
    hello = await _greet(reader, writer, job, rank)
    if isinstance(hello, RankResult):
        return hello
    answer = await read_frame(reader)
    if answer is None:
        return RankResult("connection_lost")
    if answer.get("accepted") is not True:
        return RankResult(_refusal_outcome(answer), refusal=answer)
    generation = answer.get("generation")
    if answer.get("rid") != job.rid or answer.get("rank") != rank or type(generation) is not int:
        return RankResult("ack_mismatch", refusal=answer)
    await _write_kv(hello, job, rank)
    await asyncio.sleep(job.transfer_s)
    if not job.send_done:
        return RankResult("no_done")
    done = {"done": True, "rid": job.rid, "rank": rank, "generation": generation}
    await write_frame(writer, done)
    await read_frame(reader)  # the node closes after a done
    return RankResult("complete")


async def _attempt(job: TransferJob, rank: int) -> RankResult:
    try:
        reader, writer = await asyncio.open_connection(job.host, job.ctrl_port)
    except OSError:
        return RankResult("connect_failed")
    exchange = _exchange_v16 if job.protocol == "0.1.6" else _exchange_v15
    try:
        return await exchange(reader, writer, job, rank)
    except FrameError:
        return RankResult("protocol_error")
    except (ConnectionError, OSError):
        return RankResult("connection_lost")
    finally:
        await close_quietly(writer)


async def send_rank(job: TransferJob, rank: int) -> RankResult:
    """Run the control-plane exchange for one rank (with 0.1.6's retries)."""
    if job.protocol != "0.1.6":
        return await _attempt(job, rank)
    delay = ADMISSION_BACKOFF_S * job.backoff_scale
    for attempt in range(1, job.attempts + 1):
        result = await _attempt(job, rank)
        result.attempts = attempt
        error = None if result.refusal is None else result.refusal.get("error")
        if error not in _TRANSIENT or attempt == job.attempts:
            return result
        await asyncio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


async def send(job: TransferJob, ranks: tuple[int, ...]) -> dict[int, RankResult]:
    """Transfer ``job`` from every sender rank at once; result per rank."""
    results = await asyncio.gather(*(send_rank(job, rank) for rank in ranks))
    return dict(zip(ranks, results, strict=True))
