"""The `real_tilert` tier: TileRT's own decode node (releases 0.1.5 and 0.1.6 from PyPI, on
the CPU with a stub engine: tests/real_tilert/tilert_node.py says what runs for real and
what is stubbed) beside a simulated one (`sim.tilert`) of the same release, configured
alike, the same cases asked of both.

`python -m tests.real_tilert.install` puts TileRT in `.venv-tilert/`; without it these
tests fail and say so. Per release (`release`, module scope), `pair` is one real node and
one simulator process serving a simulated node and the prefill server both nodes get
their transfers from (`sim.vllm`, playing that release's connector: 8 sender ranks on
0.1.6, as TileRT's default, rank 0 alone on 0.1.5; GLM-5's layout version 10), started
once per run and worker, reset for each module.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.stack import NodeInfo, SimStack
from sim.tokenizers import Vocab, load_vocab
from tests.real_tilert.install import RELEASES, ready
from tests.real_tilert.node import START_TIMEOUT_S, RealNode
from tests.support.deployment import directive
from tests.support.legs import tilert_prefill_body

REAL_TILERT_DIR = Path(__file__).resolve().parent
LAYOUT_VERSION = "10"  # TileRT's GLM-5 profile, fp8 MLA cache
MAX_SEQ_LEN = 4096  # TileRT's decode server's default
SENDERS = {"0.1.5": 1, "0.1.6": 8}  # TileRT's defaults: rank 0 alone; TILERT_PD_SENDERS=8
PRODUCTION_CAPABILITIES = {"penalties": False, "ignore_eos": True, "logprobs": False}
STREAM_INTERVAL_MS = "20"  # 0.1.6 batches stream lines every 200 ms: same lines, sooner
KINDS = ("real", "sim")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_tilert: runs against TileRT's own decode node (tests.real_tilert)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(REAL_TILERT_DIR):
            item.add_marker(pytest.mark.real_tilert)
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(START_TIMEOUT_S + 120))


def require_tilert() -> None:
    """Fail, saying what to run, when the tier's TileRT is not installed."""
    if not ready():
        pytest.fail(
            "TileRT is not installed for the real_tilert tier: "
            "run `python -m tests.real_tilert.install`",
            pytrace=False,
        )


@functools.cache
def vocab() -> Vocab:
    """The tokenizer both nodes' outputs are read with (the simulators' default)."""
    return load_vocab("deepseek")


@dataclass(frozen=True)
class Pair:
    """A real and a simulated node of one release, and the prefill server for both."""

    release: str
    stack: SimStack
    real: RealNode

    @property
    def prefill_url(self) -> str:
        return self.stack.prefills[0].url

    def node(self, kind: str) -> NodeInfo:
        if kind == "real":
            assert self.real.info is not None
            return self.real.info
        return self.stack.nodes[0]

    def will_say(self, kind: str, text: str, **engine: Any) -> list[dict[str, str]]:
        """Chat messages making node `kind` output `text` after the prefill's first token:
        the simulated prefill and node read the directive, the real node's stub engine is
        told the same ids. `engine`: more stub-engine settings (`token_interval_ms`)."""
        if kind == "real":
            ids = vocab().encode(text)[1:]
            set_engine(self.real.url, output_ids=ids, **engine)
        return [{"role": "user", "content": directive(text)}]

    def capabilities(self, kind: str, **flags: bool) -> None:
        """Change what node `kind`'s engine reports and accepts."""
        if kind == "real":
            set_engine(self.real.url, capabilities=flags)
        else:
            response = httpx.post(self.node(kind).url + "/sim/capabilities", json=flags)
            response.raise_for_status()


def set_engine(url: str, **values: Any) -> dict[str, Any]:
    response = httpx.post(url + "/stub/engine", json=values, timeout=10)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def node_args(release: str) -> list[str]:
    args = ["--protocol", release, "--layout-version", LAYOUT_VERSION]
    args += ["--max-seq-len", str(MAX_SEQ_LEN), "--step-ms", "1", "--tokens-per-step", "1"]
    if release == "0.1.6":
        args += ["--senders", str(SENDERS[release]), "--stream-interval-ms", STREAM_INTERVAL_MS]
    return args


def prefill_args(release: str) -> list[str]:
    args = ["--tilert-protocol", release, "--layout-version", LAYOUT_VERSION]
    args += ["--itl-ms", "0", "--prefill-ms-per-token", "0"]
    if release == "0.1.6":
        args += ["--tilert-senders", str(SENDERS[release])]
    return args


class PairPool:
    """The run's pairs, one per release, started the first time a module asks (modules of
    the tier on one worker share them), handed out reset."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._pairs: dict[str, Pair] = {}
        self._stacks = contextlib.ExitStack()

    def get(self, release: str) -> Pair:
        pair = self._pairs.get(release)
        if pair is None:
            pair = self._pairs[release] = self._start(release)
        reset(pair)
        return pair

    def _start(self, release: str) -> Pair:
        eos = ",".join(str(i) for i in vocab().eos_ids)
        real = RealNode(
            release,
            self._logs / f"tilert-{release}.log",
            ["--stop-ids", eos, "--token-interval-ms", "1"],
            env={"TILERT_DECODE_POLL_MS": STREAM_INTERVAL_MS},
        )
        stack = SimStack(
            nodes=1,
            prefills=1,
            model=list(KINDS),  # the served names: the gateway names its models after the nodes
            node_args=node_args(release),
            prefill_args=prefill_args(release),
        )
        self._stacks.enter_context(stack)
        self._stacks.callback(real.stop)
        real.start()
        return Pair(release, stack, real)

    def close(self) -> None:
        self._stacks.close()


def reset(pair: Pair) -> None:
    """Both nodes as started: the production engines' capabilities, no faults, no records."""
    set_engine(pair.real.url, capabilities=PRODUCTION_CAPABILITIES, token_interval_ms=1)
    sim = pair.node("sim").url
    httpx.delete(sim + "/sim/faults", timeout=10).raise_for_status()
    httpx.post(sim + "/sim/reset", timeout=10).raise_for_status()
    pair.capabilities("sim", **PRODUCTION_CAPABILITIES)


@pytest.fixture(scope="session")
def tilert_pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PairPool]:
    require_tilert()
    pool = PairPool(tmp_path_factory.mktemp("tilert"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module", params=list(RELEASES))
def release(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture(scope="module")
def pair(release: str, tilert_pairs: PairPool) -> Pair:
    return tilert_pairs.get(release)


@dataclass(frozen=True)
class Transfer:
    """A prefill's KV transfer to a node: what `/pd/decode` needs to consume it."""

    rid: str
    first_token_id: int
    prompt_tokens: int


def prefill(pair: Pair, kind: str, text: str) -> Transfer:
    """Prefill a chat asking for `text` with node `kind` as the transfer's target, as the
    gateway does (docs/protocols.md §1.1); return once the prefill has answered."""
    rid = uuid.uuid4().hex
    body = tilert_prefill_body(
        {"model": kind, "messages": pair.will_say(kind, text)}, pair.node(kind)
    )
    answer = httpx.post(
        pair.prefill_url + "/v1/chat/completions",
        json=body,
        headers={"x-request-id": rid},
        timeout=30,
    )
    answer.raise_for_status()
    data = answer.json()
    token = data["choices"][0]["logprobs"]["content"][0]["token"]
    return Transfer(rid, int(token.removeprefix("token_id:")), data["usage"]["prompt_tokens"])


def decode_lines(url: str, body: dict[str, Any], timeout_s: float = 30) -> tuple[int, list[Any]]:
    """POST /pd/decode: the status and the answer's JSON lines (one for a whole answer)."""
    with httpx.stream("POST", url + "/pd/decode", json=body, timeout=timeout_s) as answer:
        text = answer.read().decode()
    return answer.status_code, [json.loads(line) for line in text.splitlines() if line]
