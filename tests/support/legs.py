"""What each leg of a disaggregated request must carry, as the simulators record it.

Written out from the protocols (vLLM's NIXL connector, the TileRT connector), not from the
gateway's code: tests compare what an upstream received with these.
"""

from __future__ import annotations

from typing import Any

from sim.stack import NodeInfo, ServerInfo
from sim.vllm.nixl import producer_params

# A NIXL producer's prefill (pull and push alike): keep the KV state for a remote decode.
NIXL_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def nixl_prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg of `body` on the throughput path: one token, not streamed."""
    return {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": NIXL_PREFILL_PARAMS}


def tilert_prefill_body(body: dict[str, Any], node: NodeInfo) -> dict[str, Any]:
    """The prefill leg of a chat `body` on the latency path: one token with its id, the
    sampling made explicit (vLLM's defaults, for a body that sets none), the prompt's ids
    asked for (to continue the output should its node fail), and the TileRT node the KV
    state goes to."""
    return {
        **body,
        "max_tokens": 1,
        "stream": False,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "kv_transfer_params": {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port},
    }


def pull_decode_params(prefill: ServerInfo, request_id: str, prompt_tokens: int) -> dict[str, Any]:
    """A pull decode leg's parameters: the simulated producer's answer for a prompt of
    `prompt_tokens` (none of them cached), naming the request id."""
    return producer_params(
        prefill.engine_id,
        prefill.side_channel_host,
        prefill.side_channel_port,
        request_id,
        prompt_tokens,
    )


def push_decode_params(prefill: ServerInfo, request_id: str) -> dict[str, Any]:
    """A push decode leg's parameters: the prefill engine that will send the KV state."""
    return {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_engine_id": prefill.engine_id,
        "remote_host": prefill.side_channel_host,
        "remote_port": prefill.side_channel_port,
        "tp_size": 1,
        "pp_size": 1,
        "remote_request_id": request_id,
    }
