"""One generation request through the simulated vLLM server, connectors included.

Per request: validate, derive ids (docs/protocols.md §1.2), plan the output, let the
connectors act on ``kv_transfer_params`` by role (TileRT sender and NIXL producer on a
prefill instance, NIXL consumer on a decode instance), then answer, stream or not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from sim import ids
from sim.chat_template import ChatTemplateError
from sim.faults import FaultBoard
from sim.ids import Endpoint
from sim.script import (
    Plan,
    completion_prompts,
    continued,
    extend_output,
    plan_chat,
    plan_completion,
)
from sim.tokenizers import Vocab
from sim.vllm import nixl, responses, tilert_connector
from sim.vllm.config import FAULTS, ServerConfig
from sim.vllm.engine import Step, generate
from sim.vllm.errors import ApiError, invalid, json_error, schema_error
from sim.vllm.formats import Echo, Formatter, system_fingerprint, usage
from sim.vllm.kv_events import KvEventPublisher, admission_events, all_cleared
from sim.vllm.load import EngineLoad, Ticket
from sim.vllm.metrics import ServerCounters
from sim.vllm.parsers import NativeParser, thinks
from sim.vllm.prefix_cache import Admission, PrefixCache
from sim.vllm.records import RequestRecord, ServerRecords, TransferRecord
from sim.vllm.responses import ResponsesFormatter
from sim.vllm.validation import (
    ChatRequest,
    CompletionRequest,
    check_prompt,
    check_sampling,
    check_stop_token_ids,
    parse_request,
)

GenerationEndpoint = Endpoint | Literal["responses"]
"""The endpoints that generate: chat, completions, and responses (served as a chat)."""

_AUTO_TOOLS_MESSAGE = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


class SimulatedDeath(RuntimeError):
    """Raised inside a stream to drop the connection mid-response."""


@dataclass(frozen=True, slots=True)
class Source:
    """Where a request's output comes from and what its usage reports."""

    output_ids: list[int]
    prompt_len: int
    cached_tokens: int
    prefill_s: float
    local: bool  # prefilled here (not read from a remote prefill)


class Run:
    """A request's hold on the engine, from admission until its last token is out."""

    def __init__(self, counters: ServerCounters) -> None:
        self._counters = counters
        self.ticket: Ticket | None = None

    def token(self) -> None:
        """One output token generated."""
        self._counters.generation_tokens += 1

    def finish(self, reasons: list[str | None]) -> None:
        """The request ended (each choice with its finish reason, None if cut short)."""
        if self.ticket is None:
            return
        self.ticket.release()
        self.ticket = None
        for reason in reasons:
            self._counters.request_success[reason or "abort"] += 1

    def abandon(self) -> None:
        """The request ended without an answer (an error after admission)."""
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None


class VllmServer:
    """Process-lifetime state of one simulated vLLM server."""

    def __init__(self, config: ServerConfig, vocab: Vocab) -> None:
        self.config = config
        self.vocab = vocab
        # As vLLM's bound: ids need not be dense (GLM's special tokens sit far above).
        ids = vocab.tokenizer.get_vocab(with_added_tokens=True).values()
        self._max_token_id = max(vocab.size - 1, *ids)
        self.records = ServerRecords()
        self.faults = FaultBoard(FAULTS)
        self.faults.arm(config.faults)
        self.store = nixl.KvStore(config.kv_expiry_s)
        self.side_channel_port = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.load = EngineLoad(config.max_num_seqs, config.block_size, config.num_gpu_blocks)
        self._prefill_turn = asyncio.Lock() if config.serial_prefill else None
        self.prefix_cache = PrefixCache(config.block_size, config.num_gpu_blocks)
        self.counters = ServerCounters()
        self.kv_events = (
            KvEventPublisher(config.kv_events_endpoint, config.kv_events_topic)
            if config.kv_events_endpoint
            else None
        )

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
        endpoint: GenerationEndpoint,
        path: str,
        raw: bytes,
        headers: dict[str, str],
    ) -> Response:
        """Answer one request to ``/v1/chat/completions``, ``/v1/completions`` or
        ``/v1/responses``."""
        body: Any
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            body = raw.decode("utf-8", "replace")
            bad_json: ApiError | None = json_error(exc)
        else:
            bad_json = None
        record = RequestRecord(path, headers, body, self.config.role, self.config.engine_id)
        self.records.requests.append(record)
        queued_ms = self.faults.take("queued_ms", float)  # waiting for the engine, as vLLM queues
        if queued_ms:
            await asyncio.sleep(queued_ms / 1000)
        run = Run(self.counters)
        try:
            media = headers.get("content-type", "application/json").split(";")[0].strip()
            if media.lower() != "application/json":
                raise schema_error(
                    "1 validation error:\n  Unsupported Media Type: Only 'application/json' "
                    "is allowed",
                    None,
                )
            if bad_json is not None:
                raise bad_json
            return await self._handle(endpoint, body, headers, record, run)
        except ApiError as exc:
            run.abandon()
            record.status, record.finished = exc.status, time.time()
            return JSONResponse(exc.body(), status_code=exc.status)
        except BaseException:
            run.abandon()
            raise

    async def _handle(
        self,
        endpoint: GenerationEndpoint,
        body: Any,
        headers: dict[str, str],
        record: RequestRecord,
        run: Run,
    ) -> Response:
        status = self.faults.take("http_status", int)
        if status:
            raise ApiError(status, f"simulated failure (HTTP {status})")
        if self.faults.take("stall", bool):
            await asyncio.Event().wait()  # never answers
        responses_body = None
        if endpoint == "responses":
            responses_body, body, endpoint = body, responses.chat_request(body), "chat"
        request = parse_request(endpoint, body)
        names = self.config.served_model_names
        if request.model is not None and request.model not in names:
            raise ApiError(
                404,
                f"The model `{request.model}` does not exist. Valid aliases: {', '.join(names)}.",
                "model",
            )
        if isinstance(request, ChatRequest):
            self._check_tool_choice(request)
        else:
            check_prompt(request)
        base = headers.get("x-request-id") or ids.random_base()
        record.request_id = ids.response_id(endpoint, base)
        if responses_body is not None:
            record.request_id = "resp_" + base
        record.engine_request_id = ids.engine_request_id(endpoint, base)
        record.rid = ids.reduce_rid(record.engine_request_id)
        plans = self._plans(request)
        budget = self._budget(
            request, plans, "max_output_tokens" if responses_body is not None else None
        )
        kv = request.kv_transfer_params or {}
        plan = plans[0]
        if request.ignore_eos and budget is not None:
            plans = [extend_output(self.vocab, p, budget) for p in plans]
            plan = plans[0]
        source = await self._source(kv, plan, base, record)
        output_len = min(len(source.output_ids), budget)
        run.ticket = await self.load.admit(source.prompt_len + output_len)
        source = self._prefill(source, plan)
        self.counters.prompt_tokens += sum(len(p.prompt_ids) for p in plans[1:])
        await self._compute_prefill(source.prefill_s)
        outputs = [source.output_ids] + [p.output_ids for p in plans[1:]]
        choices = [
            generate(
                self.vocab,
                outputs[index // request.choices],
                budget,
                request.stop_strings,
                request.stop_token_ids or (),
            )
            for index in range(len(plans) * request.choices)
        ]
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
                source.cached_tokens,
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
            text_logprobs=bool(self.faults.take("text_logprobs", bool)),
            parsers=[self._parser(request) for _ in choices],
            echoes=self._echoes(request, plans),
            include_usage=request.include_usage,
            fingerprint=system_fingerprint(self.config.model_name),
            prompt_ids=(
                [plans[i // request.choices].prompt_ids for i in range(len(choices))]
                if request.return_token_ids
                else None
            ),
        )
        prompt_tokens = source.prompt_len + sum(len(p.prompt_ids) for p in plans[1:])
        cached = source.cached_tokens if self.config.prompt_tokens_details else None
        usage_body = usage(prompt_tokens, sum(len(c) for c in choices), cached)
        if responses_body is not None:
            return self._responses(
                ResponsesFormatter(formatter, responses_body, request.max_tokens),
                choices[0],
                usage_body,
                request,
                record,
                run,
            )
        if request.stream:
            return self._stream(
                formatter, choices, usage_body, request, record, after_response, run
            )
        if (die_after := self.faults.take("die_after", int)) is not None:
            return self._died(min(die_after, len(choices[0])), run)
        await self._decode(len(choices[0]))
        self._generated(run, choices)
        record.status, record.finished = 200, time.time()
        return JSONResponse(
            formatter.response(choices, usage_body, kv_out),
            background=BackgroundTask(after_response) if after_response else None,
        )

    def _died(self, tokens: int, run: Run) -> Response:
        """A whole answer whose server dies after `tokens` tokens: the head and a byte of
        white space go out, then the connection drops."""

        async def body() -> AsyncIterator[bytes]:
            try:
                yield b" "
                await self._decode(tokens)
            finally:
                run.finish([None])
            raise SimulatedDeath("simulated server death before the answer was whole")

        return StreamingResponse(body(), media_type="application/json")

    def _gap_s(self) -> float:
        """The time to the next output token: ``--itl-ms``, plus ``--itl-ms-per-running`` for
        every other request running (as ``vllm:num_requests_running`` counts them) when the
        gap starts, as a vLLM engine step computes a token for each request in its batch and
        takes longer the larger the batch."""
        others = max(self.load.running - 1, 0)
        return (self.config.itl_ms + self.config.itl_ms_per_running * others) / 1000

    async def _next_token(self) -> None:
        """The gap before the next output token."""
        await asyncio.sleep(self._gap_s())

    async def _decode(self, tokens: int) -> None:
        """The time a whole (not streamed) answer of ``tokens`` tokens takes after its first.
        Token by token when the gap follows the load (the batch changes while it generates);
        one sleep otherwise."""
        if not self.config.itl_ms_per_running:
            await asyncio.sleep(max(tokens - 1, 0) * self.config.itl_ms / 1000)
            return
        for _ in range(tokens - 1):
            await self._next_token()

    async def _compute_prefill(self, seconds: float) -> None:
        """A prefill's time; with --serial-prefill, after the prefills that arrived before
        it (an asyncio lock is taken in arrival order)."""
        if self._prefill_turn is None:
            await asyncio.sleep(seconds)
            return
        async with self._prefill_turn:
            await asyncio.sleep(seconds)

    def _prefill(self, source: Source, plan: Plan) -> Source:
        """Look the prompt up in the prefix cache and cache it; the prefill time grows with
        the uncached tokens only."""
        counters = self.counters
        counters.prompt_tokens += source.prompt_len
        if not source.local:
            counters.prompt_tokens_cached += source.cached_tokens
            if self.config.enable_prefix_caching:
                # The blocks a transfer brought are in this server's cache from now on, as
                # a vLLM decode instance keeps them for the prompts that share them.
                self._admit(plan)
            return source
        if not self.config.enable_prefix_caching:
            return source
        admission = self._admit(plan)
        cached = admission.cached_tokens
        counters.prefix_cache_queries += source.prompt_len
        counters.prefix_cache_hits += cached
        counters.prompt_tokens_cached += cached
        prefill_ms = (
            self.config.prefill_ms_per_token * (source.prompt_len - cached)
            + self.config.cached_prefill_ms_per_token * cached
        )
        return replace(source, cached_tokens=cached, prefill_s=prefill_ms / 1000)

    @staticmethod
    def _generated(run: Run, choices: list[list[Step]]) -> None:
        """A whole (not streamed) answer generated: count its tokens, end the run."""
        for steps in choices:
            for _ in steps:
                run.token()
        run.finish([steps[-1].finish_reason if steps else "stop" for steps in choices])

    def _admit(self, plan: Plan) -> Admission:
        admission = self.prefix_cache.admit(plan.prompt_ids)
        if self.kv_events is not None:
            self.kv_events.publish(
                admission_events(plan.prompt_ids, self.config.block_size, admission)
            )
        return admission

    def clear_prefix_cache(self) -> None:
        """Forget every cached block (announced as vLLM announces a prefix-cache reset)."""
        if self.prefix_cache.clear() and self.kv_events is not None:
            self.kv_events.publish(all_cleared())

    def _check_tool_choice(self, request: ChatRequest) -> None:
        """vLLM refuses a tool choice it has no tool-call parser for (only with
        ``--refuse-unparsed-tool-choice``: by default the markup stays content)."""
        if not self.config.refuse_unparsed_tool_choice:
            return
        if self.config.parsers.tool_call_parser is not None or not request.tools:
            return
        choice = request.tool_choice
        if choice == "none":
            return
        if request.auto_tools:
            raise ApiError(400, _AUTO_TOOLS_MESSAGE)
        name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        described = f'function "{name}"' if isinstance(choice, dict) else f'"{choice}"'
        raise ApiError(400, f"tool_choice={described} requires --tool-call-parser to be set")

    def _budget(
        self,
        request: ChatRequest | CompletionRequest,
        plans: list[Plan],
        budget_name: str | None = None,
    ) -> int:
        """The output budget once the prompt is checked against the context, as vLLM
        clamps it (``max_tokens`` above ``max_model_len`` is refused)."""
        limit = self.config.max_model_len
        for plan in plans:
            if len(plan.prompt_ids) > limit:
                raise invalid(
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"prompt contains {len(plan.prompt_ids)} input tokens, which exceeds this "
                    "limit even without any output tokens. Please reduce the length of the "
                    "input prompt.",
                    "input_tokens",
                    len(plan.prompt_ids),
                )
        wanted = request.budget
        if wanted is not None and wanted > limit:
            name = budget_name or "max_tokens"
            if isinstance(request, ChatRequest) and request.max_completion_tokens:
                name = "max_completion_tokens"
            raise invalid(
                f"{name}={wanted} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                name,
                wanted,
            )
        check_sampling(request)
        check_stop_token_ids(request, self._max_token_id + 1)
        room = limit - max(len(plan.prompt_ids) for plan in plans)
        budget = room if wanted is None else min(wanted, room)
        if budget < 1:  # a prompt filling the whole context leaves nothing to generate
            raise invalid(f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget)
        return budget

    def _echoes(
        self, request: ChatRequest | CompletionRequest, plans: list[Plan]
    ) -> list[Echo] | None:
        if not isinstance(request, CompletionRequest) or not request.echo:
            return None
        only = request.max_tokens == 0
        return [
            Echo(self.vocab.decode(plan.prompt_ids), list(plan.prompt_ids), only)
            for plan in plans
            for _ in range(request.choices)
        ]

    def _responses(
        self,
        view: ResponsesFormatter,
        steps: list[Step],
        usage_body: dict[str, Any],
        request: ChatRequest | CompletionRequest,
        record: RequestRecord,
        run: Run,
    ) -> Response:
        """The answer to ``/v1/responses``."""
        if not request.stream:
            self._generated(run, [steps])
            record.status, record.finished = 200, time.time()
            return JSONResponse(view.response(steps, usage_body))

        die_after = self.faults.take("die_after", int)

        async def events() -> AsyncIterator[bytes]:
            sent = 0
            try:
                async for event in view.events(steps, usage_body, self._next_token):
                    if die_after is not None and sent >= die_after:
                        raise SimulatedDeath("simulated server death mid-stream")
                    sent += 1
                    yield event
            except BaseException:
                run.finish([None])
                raise
            self._generated(run, [steps])
            record.status, record.finished = 200, time.time()

        return StreamingResponse(events(), media_type="text/event-stream")

    def _parser(self, request: ChatRequest | CompletionRequest) -> NativeParser | None:
        """A parser for a chat answer when the server runs reasoning or tool-call parsers."""
        if not isinstance(request, ChatRequest) or not self.config.parsers.active:
            return None
        return NativeParser(
            self.config.parsers,
            tools=request.tool_dicts,
            tool_choice=request.tool_choice,
            chat_template_kwargs=request.chat_template_kwargs,
        )

    def _plans(self, request: ChatRequest | CompletionRequest) -> list[Plan]:
        """One plan per prompt (a completion may have several), prompts checked."""
        default = self.config.default_output_tokens
        if isinstance(request, ChatRequest):
            if not request.messages:
                raise ApiError(
                    400,
                    "Cannot apply chat template to an empty conversation. "
                    "Provide at least one message.",
                )
            try:
                plan = plan_chat(
                    self.vocab,
                    request.message_dicts,
                    default,
                    request.tool_dicts,
                    request.chat_template_kwargs,
                    thinks=thinks(self.config.parsers, request.chat_template_kwargs),
                )
            except ChatTemplateError as exc:
                raise ApiError(400, str(exc)) from exc
            # As vLLM 0.32: ids a disaggregated prefill forwards replace the rendering.
            reused = (request.kv_transfer_params or {}).pop("prompt_token_ids", None)
            if reused is not None:
                if (
                    not isinstance(reused, list)
                    or not reused
                    or any(type(i) is not int or i < 0 for i in reused)
                ):
                    raise ApiError(
                        400,
                        "`kv_transfer_params['prompt_token_ids']` must be a non-empty list "
                        "of non-negative integers.",
                    )
                self._check_vocabulary(reused)
                plan = continued(plan, reused)
            return [plan]
        plans = []
        for prompt in completion_prompts(request.prompt):
            if isinstance(prompt, list):
                self._check_vocabulary(prompt)
            plans.append(plan_completion(self.vocab, prompt, default))
        return plans

    def tokenize(self, body: dict[str, Any]) -> list[int]:
        """``POST /tokenize``: a chat's prompt ids as a chat request renders them, or a
        completion prompt's. Raises ValueError for a body neither."""
        if "messages" in body:
            chat = ChatRequest.model_validate(body)  # a pydantic ValidationError is a ValueError
            try:
                plan = plan_chat(
                    self.vocab,
                    chat.message_dicts,
                    self.config.default_output_tokens,
                    chat.tool_dicts,
                    chat.chat_template_kwargs,
                )
            except ChatTemplateError as exc:
                raise ValueError(str(exc)) from exc
            return plan.prompt_ids
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("give `messages` or a `prompt` string")
        return plan_completion(self.vocab, prompt, self.config.default_output_tokens).prompt_ids

    def _check_vocabulary(self, token_ids: list[int]) -> None:
        for token_id in (min(token_ids, default=0), max(token_ids, default=0)):
            if not 0 <= token_id <= self._max_token_id:
                raise ApiError(400, f"Token id {token_id} is out of vocabulary")

    async def _source(
        self, kv: dict[str, Any], plan: Plan, base: str, record: RequestRecord
    ) -> Source:
        prompt_len = len(plan.prompt_ids)
        prefill_s = self.config.prefill_ms_per_token * prompt_len / 1000
        if not (self.consumes and kv.get("do_remote_prefill") is True):
            return Source(list(plan.output_ids), prompt_len, 0, prefill_s, local=True)
        push = not kv.get("remote_block_ids")
        record.kv_mode = "nixl_consumer_push" if push else "nixl_consumer_pull"
        key = str(kv.get("remote_request_id") or base)
        try:
            if self.faults.take("pull_fail", bool):
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
        return Source(state.output_ids, prompt_len, prompt_len, 0.0, local=False)

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
        extra_ms = self.faults.take("slow_transfer_ms", float) or 0.0
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
            send_done=not self.faults.take("transfer_no_done", bool),
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
        choices: list[list[Step]],
        usage_body: dict[str, Any],
        request: ChatRequest | CompletionRequest,
        record: RequestRecord,
        after_response: Callable[[], Awaitable[None]] | None,
        run: Run,
    ) -> Response:
        """vLLM's stream: per engine step one chunk per choice still running (chat first
        sends each choice's role chunk), then the usage chunk if asked, then [DONE]."""
        die_after = self.faults.take("die_after", int)
        chat = formatter.endpoint == "chat"
        prompt_tokens = usage_body["prompt_tokens"]

        async def events() -> AsyncIterator[bytes]:
            reasons: list[str | None] = [None] * len(choices)
            try:
                async for event in stream(reasons):
                    yield event
            finally:
                run.finish(reasons)

        async def stream(reasons: list[str | None]) -> AsyncIterator[bytes]:
            sent = 0

            def event(payload: bytes) -> bytes:
                nonlocal sent
                if die_after is not None and sent >= die_after:
                    raise SimulatedDeath("simulated server death mid-stream")
                sent += 1
                return b"data: " + payload + b"\n\n"

            def counted(chunk: dict[str, Any], completion_tokens: int) -> dict[str, Any]:
                if not request.continuous_usage:
                    return chunk
                running: dict[str, Any] = {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                    "completion_tokens": completion_tokens,
                }
                if chat:
                    running["completion_tokens_details"] = None
                # vLLM's running count goes right after the choices.
                head = {k: v for k, v in chunk.items() if k != "system_fingerprint"}
                tail = {k: v for k, v in chunk.items() if k == "system_fingerprint"}
                return {**head, "usage": running, **tail}

            if chat:
                for index in range(len(choices)):
                    chunk = counted(formatter.role_chunk(index), 0)
                    yield event(orjson.dumps(formatter.with_prompt_fields(chunk)))
            offsets = [0] * len(choices)
            for position in range(max(len(steps) for steps in choices)):
                if position:
                    await self._next_token()
                for index, steps in enumerate(choices):
                    if position >= len(steps):
                        continue
                    step = steps[position]
                    run.token()
                    if record.first_output is None:
                        record.first_output = time.time()
                    if position == len(steps) - 1:
                        reasons[index] = step.finish_reason or "stop"
                    chunk = formatter.chunk(step, offsets[index], index, first=position == 0)
                    logprobs = chunk["choices"][0]["logprobs"]
                    if logprobs is not None and not chat and logprobs["tokens"]:
                        offsets[index] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
                    else:
                        offsets[index] += len(chunk["choices"][0]["text"] if not chat else "")
                    chunk = counted(chunk, position + 1)
                    # A parser holding text back sends nothing for the step, unless the
                    # step's ids or logprobs were asked for.
                    parser = formatter.parsers[index] if chat else None
                    if parser is not None and not chunk["choices"][0]["delta"]:
                        shown = formatter.logprobs is not None or request.return_token_ids
                        if step.finish_reason is None and not shown:
                            continue
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
