"""`pull` mode (docs/protocols.md §2.2): prefill first, then the decode instance reads its KV.

The prefill's `kv_transfer_params` names where the KV state waits; the decode leg carries it
verbatim along with the client's original body, and its answer is the client's. Either leg
whose server was unreachable is sent once more to another server of its set. With
`conditional`, a request whose prompt the chosen decode server mostly holds, or that the
prefill servers are too busy for, is served whole there (`SplitPath._whole_on`).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from router.errors import UpstreamError
from router.selection import Choice, call_on
from router.serving import Answer, RoutedRequest
from router.throughput.legs import (
    SplitPath,
    chosen,
    decode_answer,
    planned_servers,
    run_prefill,
    send_decode,
    whole_on_decode,
)
from router.upstream import Reply
from router.upstream.vllm import NixlPrefilled, pull_decode_body


class PullPath(SplitPath):
    """Each leg on a healthy server of its own set, the least busy first."""

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        upstreams = self._upstreams
        affinity = await self.affinity(request)
        if (decode_choice := self._whole_on(request, affinity)) is not None:

            async def whole(choice: Choice) -> Answer:
                chosen(request, choice, self._decode)
                go_on = self.going_on(request, stack)
                return await whole_on_decode(
                    upstreams, stack, choice.url, request, self._metrics, go_on
                )

            return await call_on(
                self._decode, whole, hold_on=stack, request=affinity, first=decode_choice
            )

        async def prefill_leg(choice: Choice) -> NixlPrefilled:
            request.access.prefill = choice.url
            return await run_prefill(upstreams, choice.url, request)

        decode_first, prefill_first = planned_servers(request, self._decode, self._prefill)
        prefill = await call_on(self._prefill, prefill_leg, request=affinity, first=prefill_first)
        body = pull_decode_body(request.body, prefill.kv_transfer_params)
        go_on = self.going_on(request, stack)

        async def decode_leg(choice: Choice) -> Reply:
            chosen(request, choice, self._decode)
            return await send_decode(upstreams, stack, choice.url, request, body, go_on)

        try:
            reply = await call_on(
                self._decode, decode_leg, hold_on=stack, request=affinity, first=decode_first
            )
        except UpstreamError as exc:
            if not self.resends(request, exc):
                raise
            return await self.resent(request, stack, affinity, exc)
        return decode_answer(reply, prefill, request, self._metrics, go_on)
