"""Requests the real tier sends to vLLM and through the gateway: the OpenAI surface a
client uses, greedy (temperature 0) so that the same server says the same thing twice."""

from __future__ import annotations

from typing import Any

from tests.real_vllm.server import MODEL

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "Tell me a story about a river."}]
USAGE = {"include_usage": True}


def chat(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 6,
        "temperature": 0,
        **fields,
    }


def completion(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {
        "model": MODEL,
        "prompt": "The quick brown fox",
        "max_tokens": 6,
        "temperature": 0,
        **fields,
    }


def response(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {
        "model": MODEL,
        "input": "Explain why the sky is blue.",
        "max_output_tokens": 6,
        "temperature": 0,
        **fields,
    }


NATIVE_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": chat(),
    "chat stream": chat(stream=True),
    "chat stream with usage": chat(stream=True, stream_options=USAGE),
    "chat stream with continuous usage": chat(
        stream=True, stream_options={**USAGE, "continuous_usage_stats": True}
    ),
    "chat n 2": chat(n=2, temperature=1.0, seed=7),
    "chat logprobs": chat(logprobs=True, top_logprobs=2),
    "chat stream logprobs": chat(stream=True, logprobs=True, top_logprobs=1),
    "chat with tools": chat(tools=TOOLS, tool_choice="none"),
    "chat with a system prompt": chat(
        messages=[{"role": "system", "content": "Answer briefly."}, *MESSAGES]
    ),
    "chat stop string": chat(stop=["e"]),
    "chat ignore eos": chat(ignore_eos=True, max_tokens=12),
    "chat seeded sampling": chat(temperature=1.0, seed=7),
    "completion": completion(),
    "completion stream": completion(stream=True, stream_options=USAGE),
    "completion echo": completion(echo=True),
    "completion logprobs": completion(logprobs=2),
    "completion of token ids": completion(prompt=[5, 6, 7, 8]),
    "completion n 2 stream": completion(n=2, stream=True, temperature=1.0, seed=7),
    "prompt scoring": completion(echo=True, logprobs=1, max_tokens=0),
    "response": response(),
    "response stream": response(stream=True),
    "response with instructions": response(instructions="Answer briefly."),
}
