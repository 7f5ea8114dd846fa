"""`pd-gateway check --probe` asks every vLLM server and proxy the configuration names for
its health, its load and its models, each URL once: healthy ones get one line each, one
that answers 503 or cannot be reached fails the check (status 1), one that does not serve
the model's name gets a warning. Runs simulated vLLM servers, hence `e2e`."""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.cli import main
from sim.stack import SimStack
from tests.gate.redis_server import free_port
from tests.support.deployment import directive, node_entry, reset, sim_post

pytestmark = pytest.mark.e2e

GLM_TOKENIZER = Path(__file__).resolve().parents[2] / "sim" / "fixtures" / "glm"


@pytest.fixture(scope="module")
def stack() -> Iterator[SimStack]:
    with SimStack(nodes=1, prefills=2, decodes=1, proxy=True, model=["m", "n"]) as stack:
        yield stack


@pytest.fixture
def sims(stack: SimStack) -> Iterator[SimStack]:
    yield stack
    reset(stack)


def write_config(tmp_path: Path, models: list[dict[str, Any]], **sections: Any) -> Path:
    path = tmp_path / "router.yaml"
    document = {"models": [{"tokenizer": str(GLM_TOKENIZER), **m} for m in models], **sections}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def deployment(stack: SimStack, *, decode: str | None = None) -> list[dict[str, Any]]:
    """Model m: latency (both prefill servers) and pull (the first prefill server again, and
    `decode`); model n: the proxy."""
    first, second = (p.url for p in stack.prefills)
    assert stack.proxy is not None
    return [
        {
            "name": "m",
            "latency": {"prefill": [first, second], "nodes": [node_entry(stack.nodes[0])]},
            "throughput": {
                "mode": "pull",
                "prefill": [first],
                "decode": [decode or stack.decodes[0].url],
            },
        },
        {"name": "n", "throughput": {"mode": "proxy", "urls": [stack.proxy.url]}},
    ]


def probe(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], list[str]]:
    status = main(["check", "--config", str(path), "--probe"])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.splitlines()


IDLE = "healthy, running 0, waiting 0, KV cache 0.0%, models: m, n"


def test_every_server_and_proxy_gets_one_line(
    tmp_path: Path, sims: SimStack, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = (p.url for p in sims.prefills)
    assert sims.proxy is not None
    status, out, err = probe(write_config(tmp_path, deployment(sims)), capsys)
    assert (status, err) == (0, [])
    servers = [line for line in out if line.startswith(("vllm ", "proxy "))]
    assert servers == [
        f"vllm {first} (model m, latency prefill, pool default; model m, pull prefill): {IDLE}",
        f"vllm {second} (model m, latency prefill, pool default): {IDLE}",
        f"vllm {sims.decodes[0].url} (model m, pull decode): {IDLE}",
        f"proxy {sims.proxy.url} (model n, throughput proxy): {IDLE}",
    ]


def test_a_server_answering_503_fails_the_check(
    tmp_path: Path, sims: SimStack, capsys: pytest.CaptureFixture[str]
) -> None:
    second = sims.prefills[1].url
    sim_post(second, "/sim/faults", {"health_503": True})
    status, out, err = probe(write_config(tmp_path, deployment(sims)), capsys)
    assert status == 1
    assert err == [
        f"error: vllm {second} (model m, latency prefill, pool default):"
        " unhealthy: /health answered 503"
    ]
    assert sum(line.startswith(("vllm ", "proxy ")) for line in out) == 3  # the others


def test_a_server_that_is_down_fails_the_check(
    tmp_path: Path, sims: SimStack, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    path = write_config(tmp_path, deployment(sims, decode=dead))
    started = time.monotonic()
    status, _, err = probe(path, capsys)
    assert time.monotonic() - started < 10
    assert status == 1
    (line,) = err
    assert line.startswith(f"error: vllm {dead} (model m, pull decode): cannot reach it: /health ")
    assert "unreachable" in line


def test_a_proxy_without_the_model_is_a_warning_not_a_failure(
    tmp_path: Path, sims: SimStack, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sims.proxy is not None
    proxy = sims.proxy.url
    models = [{"name": "other", "throughput": {"mode": "proxy", "urls": [proxy]}}]
    status, out, err = probe(write_config(tmp_path, models), capsys)
    assert status == 0
    assert f"proxy {proxy} (model other, throughput proxy): {IDLE}" in out
    assert err == [
        f"warning: proxy {proxy} (model other, throughput proxy): does not serve 'other',"
        " the model name the gateway sends (it serves: m, n)"
    ]


class HostileServer(socketserver.ThreadingTCPServer):
    """Answers `/health` and `/metrics` with an endless body (a gigabyte announced),
    `/v1/models` one byte at a time, never ending; with `silent`, never answers at all."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *, silent: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _HostileHandler)
        self.silent = silent
        self.stopped = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HostileHandler(socketserver.StreamRequestHandler):
    server: HostileServer

    def handle(self) -> None:
        request_line = self.rfile.readline().decode("latin-1")
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        if self.server.silent:
            self.server.stopped.wait()
            return
        path = request_line.split(" ")[1] if " " in request_line else ""
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
        try:
            if path == "/v1/models":
                self.wfile.write(head + b"content-length: 100000\r\n\r\n")
                while not self.server.stopped.wait(0.05):
                    self.wfile.write(b" ")
            else:
                self.wfile.write(head + b"content-length: 1000000000\r\n\r\n")
                line = b"vllm:num_requests_running 1\n" * 4096
                while not self.server.stopped.is_set():
                    self.wfile.write(line)
        except OSError:  # the prober hung up, as it should
            pass


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[HostileServer]:
    server = HostileServer(silent=getattr(request, "param", False))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopped.set()
        server.shutdown()
        server.server_close()
        thread.join()


def test_endless_and_trickling_answers_are_cut_short(
    tmp_path: Path, hostile: HostileServer, capsys: pytest.CaptureFixture[str]
) -> None:
    models = [{"name": "m", "throughput": {"mode": "proxy", "urls": [hostile.url]}}]
    path = write_config(tmp_path, models, timeouts={"connect_s": 1})
    started = time.monotonic()
    status, out, err = probe(path, capsys)
    assert time.monotonic() - started < 5
    assert status == 0
    assert (
        f"proxy {hostile.url} (model m, throughput proxy): healthy, no vLLM metrics,"
        " models: unknown (/v1/models not read within 1 s)"
    ) in out
    assert err == [
        f"warning: proxy {hostile.url} (model m, throughput proxy): cannot tell which models"
        " it serves: unknown (/v1/models not read within 1 s)"
    ]


@pytest.mark.parametrize("hostile", [True], indirect=True, ids=["silent"])
def test_a_server_that_never_answers_fails_the_check_in_bounded_time(
    tmp_path: Path, hostile: HostileServer, capsys: pytest.CaptureFixture[str]
) -> None:
    models = [{"name": "m", "throughput": {"mode": "proxy", "urls": [hostile.url]}}]
    path = write_config(tmp_path, models, timeouts={"connect_s": 1})
    started = time.monotonic()
    status, _, err = probe(path, capsys)
    assert time.monotonic() - started < 5
    assert status == 1
    assert err == [
        f"error: proxy {hostile.url} (model m, throughput proxy): no answer to /health within 1 s"
    ]


def test_classify_probe_predicts_from_the_load_a_server_reports(
    tmp_path: Path, sims: SimStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pd-gateway classify --probe`: a decode server running another client's request is
    predicted with that request running beside (classify alone assumes it idle)."""
    decode = sims.decodes[0].url
    models = deployment(sims)
    models[0]["objectives"] = {"itl_ms": 10, "itl_ms_per_running": 5}
    rules = {"rules": [{"name": "chat", "objective": {"itl_ms": 12}, "ways": ["whole"]}]}
    path = write_config(tmp_path, models, classification={"rules": rules})
    request = tmp_path / "body.json"
    request.write_text('{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    argv = ["classify", "--config", str(path), "--request", str(request)]

    def whole_line() -> str:
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  whole on ")]
        return line

    assert main(argv) == 0
    idle = whole_line()
    assert "itl 10.00 ms" in idle and idle.endswith(": meets")
    long = directive(" ".join(["word"] * 4000))  # 20 s of output at 5 ms a token
    body = {"model": "m", "messages": [{"role": "user", "content": long}], "max_tokens": 4000}
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST", decode + "/v1/chat/completions", json={**body, "stream": True}
        ) as stream,
    ):
        assert stream.status_code == 200, stream.read()
        chunks = stream.iter_bytes()  # kept: a generator collected would close the stream
        next(chunks)
        running(decode, 1)
        assert main([*argv, "--probe"]) == 0
        line = whole_line()
    assert line.startswith(f"  whole on {decode}: ")
    assert "itl 15.00 ms" in line and line.endswith(": misses")


def running(url: str, count: int, timeout_s: float = 10.0) -> None:
    """Until the server's /metrics says `count` requests are running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=5).text
        lines = [x for x in text.splitlines() if x.startswith("vllm:num_requests_running")]
        if sum(float(x.rsplit(" ", 1)[1]) for x in lines) == count:  # over its models
            return
        time.sleep(0.02)
    raise AssertionError(f"{url} never ran {count} requests")
