"""One generation request through the simulated vLLM server, connectors included.

Per request: validate, derive ids (docs/protocols.md §1.2), plan the output, let the
connectors act on ``kv_transfer_params`` by role (TileRT sender and NIXL producer on a
prefill instance, NIXL consumer on a decode instance), then answer, stream or not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from sim import ids
from sim.faults import FaultBoard
from sim.ids import Endpoint
from sim.script import Plan, plan_chat, plan_completion
from sim.tokenizers import Vocab
from sim.vllm import nixl, responses, tilert_connector
from sim.vllm.config import FAULTS, ServerConfig
from sim.vllm.engine import Step, generate
from sim.vllm.errors import ApiError
from sim.vllm.formats import Formatter, usage
from sim.vllm.parsers import NativeParser
from sim.vllm.records import RequestRecord, ServerRecords, TransferRecord
from sim.vllm.responses import ResponsesFormatter
from sim.vllm.schema import ChatRequest, CompletionRequest, parse_request


class SimulatedDeath(RuntimeError):
    """Raised inside a stream to drop the connection mid-response."""


@dataclass(frozen=True, slots=True)
class Source:
    """Where a request's output comes from and what its usage reports."""

    output_ids: list[int]
    prompt_len: int
    cached_tokens: int
    prefill_s: float


class VllmServer:
    """Process-lifetime state of one simulated vLLM server."""

    def __init__(self, config: ServerConfig, vocab: Vocab) -> None:
        self.config = config
        self.vocab = vocab
        self.records = ServerRecords()
        self.faults = FaultBoard(FAULTS)
        self.faults.arm(config.faults)
        self.store = nixl.KvStore(config.kv_expiry_s)
        self.side_channel_port = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def produces(self) -> bool:
        """Prefill-side connectors are active (TileRT sender, NIXL producer)."""
        return self.config.role in ("prefill", "both")

    @property
    def consumes(self) -> bool:
        """The NIXL consumer is active."""
        return self.config.role in ("decode", "both")

    def side_channel(self) -> nixl.SideChannel:
        """The handler serving this instance's NIXL side channel."""
        return nixl.SideChannel(
            self.config.engine_id, self.store, self.faults, self.records.side_channel_event
        )

    async def handle(
        self,
        endpoint: Endpoint | Literal["responses"],
        path: str,
        raw: bytes,
        headers: dict[str, str],
    ) -> Any:
        """Answer one request to ``/v1/chat/completions`` or ``/v1/completions``."""
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        record = RequestRecord(path, headers, body, self.config.role, self.config.engine_id)
        self.records.requests.append(record)
        try:
            return await self._handle(endpoint, body, headers, record)
        except ApiError as exc:
            record.status, record.finished = exc.status, time.time()
            return JSONResponse(exc.body(), status_code=exc.status)

    async def _handle(
        self,
        endpoint: Endpoint | Literal["responses"],
        body: Any,
        headers: dict[str, str],
        record: RequestRecord,
    ) -> Any:
        status = self.faults.take("http_status")
        if status:
            raise ApiError(status, f"simulated failure (HTTP {status})")
        if self.faults.take("stall"):
            await asyncio.Event().wait()  # never answers
        if not isinstance(body, dict):
            raise ApiError(400, "request body is not valid JSON")
        responses_body = None
        if endpoint == "responses":
            responses_body, body, endpoint = body, responses.chat_request(body), "chat"
        request = parse_request(endpoint, body)
        if request.model is not None and request.model not in self.config.served_model_names:
            raise ApiError(404, f"The model `{request.model}` does not exist.", "model")
        base = headers.get("x-request-id") or ids.random_base()
        record.request_id = ids.response_id(endpoint, base)
        record.engine_request_id = ids.engine_request_id(endpoint, base)
        record.rid = ids.reduce_rid(record.engine_request_id)
        plan = self._plan(request)
        if len(plan.prompt_ids) >= self.config.max_model_len:
            raise ApiError(400, "prompt is longer than the maximum model length", "messages")
        kv = request.kv_transfer_params or {}
        source = await self._source(kv, plan, base, record)
        await asyncio.sleep(source.prefill_s)
        steps = generate(
            self.vocab,
            source.output_ids,
            request.budget,
            request.stop_strings,
            request.stop_token_ids or (),
        )
        kv_out = None
        if self.produces and kv.get("do_remote_decode") is True:
            record.kv_mode = "nixl_producer"
            self.store.put(base, nixl.KvState(list(plan.output_ids), len(plan.prompt_ids)))
            kv_out = nixl.producer_params(
                self.config.engine_id,
                self.config.host,
                self.side_channel_port,
                base,
                len(plan.prompt_ids),
            )
        after_response = None
        if self.produces and kv.get("tilert_host"):
            record.kv_mode = "tilert"
            after_response = await self._tilert(kv, plan, request, record)
        formatter = Formatter(
            endpoint=endpoint,
            response_id=record.request_id,
            model=self.config.model_name,
            created=int(time.time()),
            vocab=self.vocab,
            logprobs=request.logprobs_count,
            text_logprobs=bool(self.faults.take("text_logprobs")),
            parser=self._parser(request),
        )
        usage_body = usage(source.prompt_len, len(steps), source.cached_tokens)
        if responses_body is not None:
            return self._responses(
                ResponsesFormatter(formatter, responses_body), steps, usage_body, request, record
            )
        if request.stream:
            return self._stream(formatter, steps, usage_body, request, record, after_response)
        await asyncio.sleep(max(len(steps) - 1, 0) * self.config.itl_ms / 1000)
        record.status, record.finished = 200, time.time()
        return JSONResponse(
            formatter.response(steps, usage_body, kv_out),
            background=BackgroundTask(after_response) if after_response else None,
        )

    def _responses(
        self,
        view: ResponsesFormatter,
        steps: list[Step],
        usage_body: dict[str, Any],
        request: ChatRequest | CompletionRequest,
        record: RequestRecord,
    ) -> Response:
        """The answer to ``/v1/responses``."""
        itl_s = self.config.itl_ms / 1000
        if not request.stream:
            record.status, record.finished = 200, time.time()
            return JSONResponse(view.response(steps, usage_body))

        die_after = self.faults.take("die_after")

        async def events() -> AsyncIterator[bytes]:
            sent = 0
            async for event in view.events(steps, usage_body, lambda: asyncio.sleep(itl_s)):
                if die_after is not None and sent >= die_after:
                    raise SimulatedDeath("simulated server death mid-stream")
                sent += 1
                yield event
            record.status, record.finished = 200, time.time()

        return StreamingResponse(events(), media_type="text/event-stream")

    def _parser(self, request: ChatRequest | CompletionRequest) -> NativeParser | None:
        """A parser for a chat answer when the server runs reasoning or tool-call parsers."""
        if not isinstance(request, ChatRequest) or not self.config.parsers.active:
            return None
        return NativeParser(
            self.config.parsers,
            tools=request.tools,
            tool_choice=request.tool_choice,
            chat_template_kwargs=request.chat_template_kwargs,
        )

    def _plan(self, request: ChatRequest | CompletionRequest) -> Plan:
        default = self.config.default_output_tokens
        if isinstance(request, ChatRequest):
            return plan_chat(self.vocab, request.messages, default)
        return plan_completion(self.vocab, request.prompt, default)

    async def _source(
        self, kv: dict[str, Any], plan: Plan, base: str, record: RequestRecord
    ) -> Source:
        prompt_len = len(plan.prompt_ids)
        prefill_s = self.config.prefill_ms_per_token * prompt_len / 1000
        if not (self.consumes and kv.get("do_remote_prefill") is True):
            return Source(list(plan.output_ids), prompt_len, 0, prefill_s)
        push = not kv.get("remote_block_ids")
        record.kv_mode = "nixl_consumer_push" if push else "nixl_consumer_pull"
        key = str(kv.get("remote_request_id") or base)
        try:
            if self.faults.take("pull_fail"):
                raise nixl.PullError("simulated KV read failure")
            state = await nixl.read_remote(
                str(kv.get("remote_host")),
                int(kv.get("remote_port") or 0),
                key,
                kv.get("remote_engine_id"),
                self.config.remote_prefill_timeout_s if push else 0.0,
            )
        except nixl.PullError as exc:
            raise ApiError(500, f"KV transfer from the remote prefill failed: {exc}") from exc
        # vLLM reports the whole prompt as cached on the decode leg.
        return Source(state.output_ids, prompt_len, prompt_len, 0.0)

    async def _tilert(
        self,
        kv: dict[str, Any],
        plan: Plan,
        request: ChatRequest | CompletionRequest,
        record: RequestRecord,
    ) -> Callable[[], Awaitable[None]] | None:
        """Start (or schedule) the TileRT transfer per ``--transfer-order``.

        Returns a coroutine function to run after the response, for response-first.
        """
        config = self.config
        prompt_len = len(plan.prompt_ids)
        extra_ms = self.faults.take("slow_transfer_ms") or 0.0
        job = tilert_connector.TransferJob(
            host=str(kv["tilert_host"]),
            ctrl_port=int(kv.get("tilert_ctrl_port") or 5556),
            rid=record.rid or "",
            seq_len=prompt_len,
            last_prompt_token=plan.prompt_ids[-1] if plan.prompt_ids else 0,
            sampling=request.sampling(),
            output_ids=list(plan.output_ids),
            transfer_s=(
                config.transfer_ms_base + config.transfer_ms_per_token * prompt_len + extra_ms
            )
            / 1000,
            send_done=not self.faults.take("transfer_no_done"),
            layout_version=config.layout_version,
            transport=config.transport,
            protocol=config.tilert_protocol,
            senders=len(config.sender_ranks),
            attempts=config.tilert_attempts,
            backoff_scale=config.tilert_backoff_scale,
        )
        if config.transfer_order == "transfer-first":
            await self._transfer(job)
            return None
        if config.transfer_order == "race":
            self._spawn(self._transfer(job))
            return None

        async def after() -> None:
            self._spawn(self._transfer(job))

        return after

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _transfer(self, job: tilert_connector.TransferJob) -> None:
        records = {
            rank: TransferRecord(job.rid, rank, job.host, job.ctrl_port, protocol=job.protocol)
            for rank in self.config.sender_ranks
        }
        self.records.transfers.extend(records.values())
        results = await tilert_connector.send(job, self.config.sender_ranks)
        for rank, result in results.items():
            record = records[rank]
            record.outcome, record.end = result.outcome, time.time()
            record.attempts, record.refusal = result.attempts, result.refusal

    def _stream(
        self,
        formatter: Formatter,
        steps: list[Step],
        usage_body: dict[str, Any],
        request: ChatRequest | CompletionRequest,
        record: RequestRecord,
        after_response: Callable[[], Awaitable[None]] | None,
    ) -> Response:
        die_after = self.faults.take("die_after")
        itl_s = self.config.itl_ms / 1000

        async def events() -> AsyncIterator[bytes]:
            sent = 0

            def event(payload: bytes) -> bytes:
                nonlocal sent
                if die_after is not None and sent >= die_after:
                    raise SimulatedDeath("simulated server death mid-stream")
                sent += 1
                return b"data: " + payload + b"\n\n"

            def counted(chunk: dict[str, Any], completion_tokens: int) -> dict[str, Any]:
                if request.continuous_usage:  # vLLM's running count on every chunk
                    chunk["usage"] = usage(
                        usage_body["prompt_tokens"],
                        completion_tokens,
                        usage_body["prompt_tokens_details"]["cached_tokens"],
                    )
                return chunk

            if formatter.endpoint == "chat":
                yield event(orjson.dumps(counted(formatter.role_chunk(), 0)))
            offset = 0
            for index, step in enumerate(steps):
                if index:
                    await asyncio.sleep(itl_s)
                chunk = counted(formatter.chunk(step, offset), index + 1)
                offset += len(step.text)
                # vLLM skips steps that add nothing (e.g. half of a multi-byte character,
                # or text a parser holds back).
                adds = step.text if formatter.parser is None else chunk["choices"][0]["delta"]
                if adds or step.finish_reason or formatter.logprobs is not None:
                    yield event(orjson.dumps(chunk))
            if request.include_usage:
                yield event(orjson.dumps(formatter.usage_chunk(usage_body)))
            yield event(b"[DONE]")
            record.status, record.finished = 200, time.time()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            background=BackgroundTask(after_response) if after_response else None,
        )
