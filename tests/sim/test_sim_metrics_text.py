"""The simulator's /metrics text reads as prometheus_client writes vLLM's metrics."""

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from sim.vllm.load import EngineLoad
from sim.vllm.metrics import ServerCounters, render


def _without_created(text: str) -> list[str]:
    return [line for line in text.splitlines() if "_created" not in line]


async def test_render_matches_prometheus_client_output() -> None:
    load = EngineLoad(max_num_seqs=None, block_size=16, num_gpu_blocks=10)
    await load.admit(tokens=40)  # 3 blocks of 16
    counters = ServerCounters(prompt_tokens=1_234_567, generation_tokens=7)
    counters.request_success["length"] = 2
    ours = render("tiny", load, counters)

    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "h", labels, registry=registry)
    running.labels("tiny", "0").set(1)
    usage = Gauge("vllm:kv_cache_usage_perc", "h", labels, registry=registry)
    usage.labels("tiny", "0").set(0.3)
    prompt = Counter("vllm:prompt_tokens", "h", labels, registry=registry)
    prompt.labels("tiny", "0").inc(1_234_567)
    success = Counter("vllm:request_success", "h", [*labels, "finished_reason"], registry=registry)
    success.labels("tiny", "0", "length").inc(2)
    theirs = generate_latest(registry).decode()

    our_lines = _without_created(ours)
    for line in _without_created(theirs):
        if line.startswith("# HELP"):
            name = line.split()[2]
            assert any(mine.startswith(f"# HELP {name} ") for mine in our_lines), name
        else:
            assert line in our_lines
    assert 'vllm:prompt_tokens_created{engine="0",model_name="tiny"} ' in ours
