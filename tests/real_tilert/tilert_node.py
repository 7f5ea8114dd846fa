"""Runs one TileRT release's own decode node on the CPU, for the `real_tilert` tier: its
decode server's HTTP app (`tilert.pd_vllm.decode_server.build_app`) and its receive
server's control plane (`tilert.pd_vllm.receive_server.ReceiveServer`), over its own model
profile (`glm5` by default: layout version, sender ranks, receive-buffer layout).

    PYTHONPATH=.venv-tilert/releases/0.1.6 .venv-tilert/bin/python tests/real_tilert/tilert_node.py

Run as a script on `.venv-tilert`'s Python (tests/real_tilert/install.py), never imported
by the project: it imports TileRT, which imports torch. TileRT's `decode_server.main()`
cannot start here: it puts the receive buffer on `cuda:0` (or in CUDA-pinned host memory)
and registers it with an RDMA engine (Mooncake or NIXL). So this script does what `main()`
does, with three stand-ins of its own where a GPU or an RDMA fabric would be needed, each
at the narrowest point TileRT's code offers:

* **transport**: `LoopbackTransport`, put in `tilert.pd_vllm.transport`'s registry of
  backends under the configured transport's name, so the receive server's
  `make_transport()` builds it: it registers nothing and writes nothing (no sender writes
  KV bytes to this node; the hello still names the transport, with a session id);
* **convert**: the profile's `convert` (reading the KV state out of the receive buffer
  into the engine's GPU tensors) is replaced on the profile object by one returning
  TileRT's own `ConvertedRequest` without layers;
* **engine**: `PacedStubEngine`, a subclass of TileRT's own `StubEngine` whose `decode`
  follows the production engines' rules (read in `MlaNsaEngineAdapter`, not copied):
  the budget is `max_tokens` (0 or less: the first token alone, `length`, nothing
  streamed), a stop token as first token is streamed and then ends the output with no
  token counted, `ignore_eos` decodes on to the budget, a cancel ends at the next step,
  `finish_reason` is `stop`, `length` or `cancelled`. It reports the production engines'
  capabilities by default (`ignore_eos` only) and refuses grammars as they do.

The receive buffer is an ordinary CPU tensor of the profile's size (the receive server's
unsharded path, with `device="cpu"`). Everything else is TileRT's code, running for real:
the HTTP API (decode, stream batching, cancel, refusals, `/capabilities`,
`/decode_status`), the control plane (hello, admission, refusals, generations, ranks,
tombstones, release), the framing, the sampling checks.

`/stub/engine` (GET, POST; ours, added to TileRT's app) shows and sets what the stub
engine produces and reports: `output_ids` (after the first token), `token_interval_ms`,
`capabilities` (`penalties`, `ignore_eos`, `logprobs`, `grammar`), the way the simulator's
`/sim/` endpoints let a test shape its node. The first stdout line is
`TILERT-READY {"ctrl_port", "http_port", "release", "layout_version", "senders"}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import threading
from importlib.metadata import version as installed_version
from typing import Any

import uvicorn
from tilert.pd_vllm import decode_server, engine_iface, receive_server, transport
from tilert.pd_vllm.profiles import base as profiles
from tilert.pd_vllm.profiles.mla_nsa import ConvertedRequest

try:  # 0.1.6; 0.1.5 has no grammars
    from tilert.pd_vllm.grammar_spec import GrammarUnsupported
except ImportError:
    GrammarUnsupported = None

READY_PREFIX = "TILERT-READY "
PRODUCTION_CAPABILITIES = {
    "penalties": False,
    "ignore_eos": True,
    "logprobs": False,
    "grammar": False,
}


class LoopbackTransport(transport.Transport):
    """Stands in for Mooncake or NIXL: the node's buffer is registered with nothing, and no
    sender ever writes into it. Named as the transport the node was configured with."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._host = ""

    def init(self, host: str) -> None:
        self._host = host

    def register(self, ptr: int, nbytes: int, dev_id: int, *more: Any, **options: Any) -> None:
        self.registered = (ptr, nbytes)

    def rails(self) -> int:
        return 0

    def local_meta(self) -> dict[str, Any]:
        return {"session_id": f"{self._host}:0"}

    def write(self, remote_meta: dict[str, Any], srcs: Any, dsts: Any, lens: Any) -> None:
        raise RuntimeError("the loopback transport writes nothing")


def convert_without_gpu(
    buffer: Any, base_ptr: Any, max_seq_len: int, received: Any, num_devices: int = 1
) -> ConvertedRequest:
    """The profile's conversion, minus the KV state: the stub engine reads none."""
    return ConvertedRequest(
        rid=received.rid,
        seq_len=received.seq_len,
        last_prompt_token=received.last_prompt_token,
        first_token_id=received.first_token_id,
        sampling=received.sampling,
        layers=[],
    )


class PacedStubEngine(engine_iface.StubEngine):
    """TileRT's stub engine, decoding as the production engines do, one token a step."""

    def __init__(self, output_ids: list[int], stop_ids: set[int], interval_s: float) -> None:
        super().__init__(fixed_tokens=tuple(output_ids))
        self.stop_ids = stop_ids
        self.interval_s = interval_s
        self.capabilities = dict(PRODUCTION_CAPABILITIES)

    def settings(self) -> dict[str, Any]:
        return {
            "output_ids": list(self._fixed),
            "token_interval_ms": self.interval_s * 1000,
            "capabilities": dict(self.capabilities),
        }

    def change(self, values: dict[str, Any]) -> None:
        if "output_ids" in values:
            self._fixed = tuple(int(i) for i in values["output_ids"])
        if "token_interval_ms" in values:
            self.interval_s = float(values["token_interval_ms"]) / 1000
        for name, flag in (values.get("capabilities") or {}).items():
            if name not in self.capabilities or not isinstance(flag, bool):
                raise ValueError(f"capabilities are booleans named {', '.join(self.capabilities)}")
            self.capabilities[name] = flag

    def supports_logprobs(self) -> bool:
        return self.capabilities["logprobs"]

    def supports_penalties(self) -> bool:
        return self.capabilities["penalties"]

    def supports_ignore_eos(self) -> bool:
        return self.capabilities["ignore_eos"]

    def prepare_grammar(self, grammar_spec: Any, enable_thinking: bool = True) -> Any:
        if grammar_spec is not None and not self.capabilities["grammar"]:
            assert GrammarUnsupported is not None
            raise GrammarUnsupported("constrained decoding is not supported")
        return super().prepare_grammar(grammar_spec, enable_thinking)

    def decode(
        self,
        first_token_id: int,
        max_tokens: int,
        sampling: dict[str, Any] | None,
        on_token: Any = None,
        cancel_event: threading.Event | None = None,
        grammar_session: Any = None,
        top_logprobs: int | None = None,
    ) -> list[int]:
        first = int(first_token_id)
        if max_tokens <= 0:
            self.last_stats = {"finish_reason": "length"}
            return [first]
        emit = self._emitter(on_token, top_logprobs)
        emit(first, None)
        if first in self.stop_ids:
            self.last_stats = {"finish_reason": "stop"}
            return []
        ignore_eos = bool((sampling or {}).get("ignore_eos"))
        tokens, finish, step = [first], "stop", 0
        while True:
            if len(tokens) >= max_tokens:
                finish = "length"
                break
            if step >= len(self._fixed) and not (ignore_eos and self._fixed):
                break  # the model's output ends here (its stop token is not emitted)
            if cancel_event is not None and cancel_event.wait(self.interval_s):
                finish = "cancelled"
                break
            token = self._fixed[step % len(self._fixed)]
            step += 1
            tokens.append(token)
            emit(token, self.fake_logprob(token) if hasattr(self, "fake_logprob") else None)
        self.last_stats = {"finish_reason": finish}
        return tokens

    @staticmethod
    def _emitter(on_token: Any, top_logprobs: int | None) -> Any:
        def emit(token: int, logprob: float | None) -> None:
            if on_token is None:
                return
            if top_logprobs is None:
                on_token(token)
            elif logprob is None:  # the first token: sampled by the prefill, not here
                on_token(token, None, [])
            else:
                candidates = [(token + k, logprob - k) for k in range(top_logprobs)]
                on_token(token, logprob, candidates)

        return emit


def build_parser() -> argparse.ArgumentParser:
    """TileRT's own decode-server options that matter on the CPU, and the stub engine's."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--model", default="glm5", help="TileRT model profile")
    add("--max-seq-len", type=int, default=4096)
    add("--kv-cache-dtype", default="fp8_ds_mla")
    add("--transport", choices=["mooncake", "nixl"], default="mooncake")
    add("--host", default="127.0.0.1", help="the HTTP API's address")
    add("--output-ids", default="", help="what the stub engine decodes after the first token")
    add("--stop-ids", default="", help="the model's stop tokens, comma-separated")
    add("--token-interval-ms", type=float, default=1.0)
    return parser


def _ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args()
    profile = profiles.get_profile(args.model)
    if hasattr(profile, "configure"):
        profile.configure(args.kv_cache_dtype)
    profile.convert = convert_without_gpu
    for name in list(transport._BACKENDS):
        transport._BACKENDS[name] = lambda name=name: LoopbackTransport(name)
    engine = PacedStubEngine(
        _ids(args.output_ids), set(_ids(args.stop_ids)), args.token_interval_ms / 1000
    )
    server = receive_server.ReceiveServer(
        profile,
        max_seq_len=args.max_seq_len,
        ctrl_port=0,
        hostname="127.0.0.1",
        device="cpu",
        transport=args.transport,
    )
    app = decode_server.build_app(server, engine)

    def stub_engine(values: dict[str, Any] | None = None) -> dict[str, Any]:
        if values:
            engine.change(values)
        return engine.settings()

    app.add_api_route("/stub/engine", stub_engine, methods=["GET", "POST"])
    http = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    http.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    http.bind((args.host, 0))
    http.listen(128)
    ready = {
        "ctrl_port": server._srv.getsockname()[1],
        "http_port": http.getsockname()[1],
        "release": installed_version("tilert"),
        "layout_version": profile.layout_version,
        "senders": len(profile.sender_ranks),
    }
    print(READY_PREFIX + json.dumps(ready), flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[http])


if __name__ == "__main__":
    sys.exit(main())
