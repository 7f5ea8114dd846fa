"""`pull` mode (docs/protocols.md §2.2): prefill first, then the decode instance reads its KV.

The prefill's `kv_transfer_params` names where the KV state waits; the decode leg carries it
verbatim along with the client's original body, and its answer is the client's.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from router.config import PullConfig
from router.selection.least_outstanding import LeastOutstanding
from router.serving import Answer, RoutedRequest
from router.throughput.legs import decode_answer, run_prefill, send_decode, whole_on_decode
from router.upstream import Upstreams
from router.upstream.vllm import pull_decode_body


class PullPath:
    """Balances each leg over its own pool by requests in flight."""

    def __init__(self, config: PullConfig, *, upstreams: Upstreams) -> None:
        self._upstreams = upstreams
        self._prefill = LeastOutstanding(config.prefill)
        self._decode = LeastOutstanding(config.decode)

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        if not request.splits:
            url = stack.enter_context(self._decode.hold(self._decode.pick()))
            return await whole_on_decode(self._upstreams, stack, url, request)
        with self._prefill.hold(self._prefill.pick()) as prefill_url:
            prefill = await run_prefill(self._upstreams, prefill_url, request)
        decode_url = stack.enter_context(self._decode.hold(self._decode.pick()))
        body = pull_decode_body(request.body, prefill.kv_transfer_params)
        reply = await send_decode(self._upstreams, stack, decode_url, request, body)
        return decode_answer(reply, prefill, request)
