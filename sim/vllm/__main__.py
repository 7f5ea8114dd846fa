"""``python -m sim.vllm``: run one simulated vLLM OpenAI server."""

from sim.vllm.cli import main

main()
