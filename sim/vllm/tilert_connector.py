"""The TileRT KV connector's sending side (PROTOCOLS.md §1.3), played by the prefill server.

One control connection per sender rank: read the hello and check it, send the request,
deliver the planned output over the node's simulated data plane (if advertised), spend
the transfer time while watching for a refusal, send done, then read to the end of the
stream: the node closes after a done, or sends an error frame if it refused.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from sim.framing import FrameError, close_quietly, read_frame, write_frame


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


def _refusal_outcome(message: dict[str, Any] | None) -> str:
    if message is None:
        return "complete"
    error = message.get("error")
    if error == "busy":
        return "refused_busy"
    if error == "seq_len exceeds max_seq_len":
        return "refused_seq_len"
    return "protocol_error"


async def _send_plan(address: dict[str, Any], job: TransferJob, rank: int) -> None:
    reader, writer = await asyncio.open_connection(address["host"], int(address["port"]))
    try:
        await write_frame(writer, {"rid": job.rid, "rank": rank, "output_ids": job.output_ids})
        await read_frame(reader)
    finally:
        await close_quietly(writer)


def _hello_ok(hello: dict[str, Any] | None, job: TransferJob) -> bool:
    return (
        hello is not None
        and hello.get("magic") == "tilert-pd"
        and hello.get("layout_version") == job.layout_version
        and hello.get("transport") == job.transport
    )


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, job: TransferJob, rank: int
) -> str:
    hello = await read_frame(reader)
    if not _hello_ok(hello, job):
        return "hello_mismatch"
    assert hello is not None
    if job.seq_len > int(hello.get("max_seq_len", 0)):
        return "seq_len_exceeds"
    request = {
        "rid": job.rid,
        "rank": rank,
        "seq_len": job.seq_len,
        "last_prompt_token": job.last_prompt_token,
        "sampling": job.sampling,
    }
    await write_frame(writer, request)
    answer = asyncio.ensure_future(read_frame(reader))
    try:
        data_plane = hello.get("sim_data_plane")
        if isinstance(data_plane, dict) and rank == 0:
            await _send_plan(data_plane, job, rank)
        finished, _ = await asyncio.wait({answer}, timeout=job.transfer_s)
        if finished:
            return _refusal_outcome(answer.result())
        if not job.send_done:
            return "no_done"
        try:
            await write_frame(writer, {"done": True, "rid": job.rid, "rank": rank})
        except (ConnectionError, OSError):
            pass  # a refusal closed the connection; the answer below says so
        return _refusal_outcome(await answer)
    finally:
        answer.cancel()


async def send_rank(job: TransferJob, rank: int) -> str:
    """Run the control-plane exchange for one rank; return its outcome."""
    try:
        reader, writer = await asyncio.open_connection(job.host, job.ctrl_port)
    except OSError:
        return "connect_failed"
    try:
        return await _exchange(reader, writer, job, rank)
    except FrameError:
        return "protocol_error"
    except (ConnectionError, OSError):
        return "connection_lost"
    finally:
        await close_quietly(writer)


async def send(job: TransferJob, ranks: tuple[int, ...]) -> dict[int, str]:
    """Transfer ``job`` from every sender rank at once; outcome per rank."""
    outcomes = await asyncio.gather(*(send_rank(job, rank) for rank in ranks))
    return dict(zip(ranks, outcomes, strict=True))
