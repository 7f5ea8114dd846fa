"""A KV connector for real vLLM that speaks TileRT's control plane (docs/protocols.md §1.3,
§1.5, §1.6) to a decode node, with no data plane: test equipment that puts a real vLLM
prefill in front of a simulated node.

Loaded by vLLM itself, from its own environment, with the project root on PYTHONPATH::

    --kv-transfer-config '{"kv_connector": "TileRTControlConnector",
                           "kv_connector_module_path": "sim.tilert_kv_connector",
                           "kv_role": "kv_producer",
                           "kv_connector_extra_config": {"tilert_protocol": "0.1.6"}}'

It claims a request only when its ``kv_transfer_params`` name ``tilert_host``. When such a
request finishes (its one-token prefill done), it runs the sender's side of the control
exchange in a thread of its own, as the sim prefill server does (``sim.vllm.
tilert_connector``), for every sender rank. It writes no KV: the node, advertising no
data plane (``--no-data-plane``), decodes its own continuation. Other requests it leaves
alone, so the same server serves the native path too.

Extra config: ``tilert_protocol`` ("0.1.5" or "0.1.6"), ``senders`` (1), ``layout_version``
(1), ``transport`` ("mooncake"), ``transfer_s`` (0.0).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from sim.ids import reduce_rid
from sim.vllm.tilert_connector import TransferJob, send

logger = logging.getLogger(__name__)


# The vLLM objects the connector reads (its config, a request) are typed Any: vLLM is
# installed only beside the real-vLLM tests, never where the checker runs.
class TileRTControlConnector(KVConnectorBase_V1):  # type: ignore[misc]  # vLLM's base is Any here
    def __init__(
        self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: object = None
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self._protocol = str(extra.get("tilert_protocol", "0.1.6"))
        self._senders = int(extra.get("senders", 1))
        self._layout_version = int(extra.get("layout_version", 1))
        self._transport = str(extra.get("transport", "mooncake"))
        self._transfer_s = float(extra.get("transfer_s", 0.0))

    # The worker side moves no KV.
    def start_load_kv(self, forward_context: object, **kwargs: object) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: object, attn_metadata: object, **kwargs: object
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    # The scheduler side: nothing to load, a control exchange when a claimed request ends.
    def get_num_new_matched_tokens(
        self, request: object, num_computed_tokens: int
    ) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(
        self, request: object, blocks: object, num_external_tokens: int
    ) -> None:
        return None

    def build_connector_meta(self, scheduler_output: object) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params or {}
        if "tilert_host" in params:
            job = self._job(request, params)
            threading.Thread(target=self._transfer, args=(job,), daemon=True).start()
        return False, None

    def _job(self, request: Any, params: dict[str, Any]) -> TransferJob:
        sampling = request.sampling_params
        prompt = list(request.prompt_token_ids or [])
        return TransferJob(
            host=str(params["tilert_host"]),
            ctrl_port=int(params.get("tilert_ctrl_port") or 5556),
            rid=reduce_rid(request.request_id),
            seq_len=len(prompt),
            last_prompt_token=prompt[-1] if prompt else 0,
            sampling={
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k,
            },
            output_ids=[],
            transfer_s=self._transfer_s,
            send_done=True,
            layout_version=self._layout_version,
            transport=self._transport,
            protocol=self._protocol,
            senders=self._senders,
        )

    def _transfer(self, job: TransferJob) -> None:
        results = asyncio.run(send(job, tuple(range(self._senders))))
        outcomes = {rank: result.outcome for rank, result in results.items()}
        logger.info("TileRT control exchange for %s: %s", job.rid, outcomes)
