"""Encoding a prompt piece by piece through the segment cache gives the ids of encoding it
whole, for DeepSeek's and GLM's tokenizers, turn after turn of growing conversations."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tracemalloc
from array import array
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tokenizers

from router.tokens import segments
from router.tokens.prompt_tokens import PromptCounter, render_chat
from router.tokens.segments import SegmentEncoder, Splitter, pre_empts, split_is_exact
from router.tokens.tokenizer import load_tokenizer, tokenizer_path

ROOT = Path(__file__).resolve().parents[2]
SPECS = ["deepseek", "sim/fixtures/glm"]
TOKENIZERS = {spec: load_tokenizer(spec, base_dir=ROOT).tokenizer for spec in SPECS}

# Templates in the style of the models' own: a special token at every message boundary,
# reasoning, tool calls and tool results.
DEEPSEEK_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}"
    "{% elif m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' %}<｜Assistant｜>"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content or '' }}"
    "{% if m.tool_calls %}<｜tool▁calls▁begin｜>{% for c in m.tool_calls %}"
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ c.function.name }}\n```json\n"
    "{{ c.function.arguments | tojson }}\n```<｜tool▁call▁end｜>{% endfor %}"
    "<｜tool▁calls▁end｜>{% endif %}<｜end▁of▁sentence｜>"
    "{% elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)
GLM_TEMPLATE = (
    "[gMASK]<sop>{% if tools %}<|system|>\n# Tools\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}{% endif %}{% for m in messages %}"
    "{% if m.role == 'tool' %}<|observation|><tool_response>{{ m.content }}</tool_response>"
    "{% else %}<|{{ m.role }}|>"
    "{% if m.role == 'assistant' %}\n<think>{{ m.reasoning_content or '' }}</think>{% endif %}"
    "\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}"
    "{% for k, v in c.function.arguments.items() %}<arg_key>{{ k }}</arg_key>"
    "<arg_value>{{ v | tojson }}</arg_value>{% endfor %}</tool_call>{% endfor %}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEMPLATES = {
    "deepseek": (DEEPSEEK_TEMPLATE, {"bos_token": "<｜begin▁of▁sentence｜>"}),
    "sim/fixtures/glm": (GLM_TEMPLATE, {}),
}

WORDS = [
    "the",
    "gateway",
    "prefill",
    " decode",
    "KV-cache",
    "12345",
    "3.14159",
    "x<y",
    "a>b",
    "预填充和解码分离",
    "日本語のテスト",
    "Café",
    "naïve",
    "Ångström",
    "🙂",
    "🚀👍🏽",
    "e\u0301",
    "\u200b",
    "def f(a, b):",
    "return a<b",
    "<div>",
    "</div>",
    '{"k": [1, 2]}',
    "'s",
    "'ll",
]
SPACES = [" ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "   \n  ", ""]
# Added tokens' text typed by a user, whole, cut, doubled or glued to other text.
TYPED = [
    "<|user|>",
    "<|assistant|>",
    "<think>",
    "</think>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜end▁of▁sentence｜>",
    "<｜tool▁sep｜>",
    "<tool_call>",
    "<arg_key>",
    "/nothink",
    "｜DSML｜",
    "<dsml:",
    "</dsml:",
    "<|use",
    "<｜tool▁",
    "<<|user|>>",
    "<think><think>",
    "[gMASK]<sop>",
    "<|endoftext|>x",
    " <think> ",
    "\n</think>\n",
]


def random_text(rng: random.Random, words: int) -> str:
    parts = [rng.choice(SPACES)]
    for _ in range(words):
        pool = TYPED if rng.random() < 0.08 else WORDS
        parts.append(rng.choice(pool) + rng.choice(SPACES[:4]))
    parts.append(rng.choice(SPACES))
    return "".join(parts)


def random_message(rng: random.Random, role: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": random_text(rng, rng.randint(0, 40))}
    if role == "assistant" and rng.random() < 0.5:
        message["reasoning_content"] = random_text(rng, rng.randint(1, 30))
    if role == "assistant" and rng.random() < 0.3:
        arguments = {"city": random_text(rng, 2), "days": rng.randint(1, 9)}
        message["tool_calls"] = [
            {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        ]
    return message


def conversation(rng: random.Random, turns: int) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": random_text(rng, 10)}]
    for _ in range(turns):
        messages.append(random_message(rng, "user"))
        assistant = random_message(rng, "assistant")
        messages.append(assistant)
        if "tool_calls" in assistant:
            messages.append(random_message(rng, "tool"))
    return messages


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def templated_counter(spec: str, directory: Path) -> PromptCounter:
    source = tokenizer_path(spec, base_dir=ROOT)
    shutil.copy(source, directory / "tokenizer.json")
    template, special = TEMPLATES[spec]
    config = {"chat_template": template, **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return PromptCounter(
        load_tokenizer(str(directory), base_dir=ROOT), directory / "tokenizer.json"
    )


def whole(spec: str, text: str) -> list[int]:
    return TOKENIZERS[spec].encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("spec", SPECS)
def test_both_tokenizers_split_exactly(spec: str) -> None:
    assert split_is_exact(TOKENIZERS[spec])


@pytest.mark.parametrize("spec", SPECS)
def test_random_texts_with_typed_special_tokens_encode_as_a_whole(spec: str) -> None:
    rng = random.Random(spec)
    encoder = SegmentEncoder(TOKENIZERS[spec])
    for _ in range(400):
        text = random_text(rng, rng.randint(0, 60))
        assert encoder.ids([text]) == whole(spec, text), repr(text)
        assert encoder.count([text]) == len(whole(spec, text))


@pytest.mark.parametrize("spec", SPECS)
def test_the_splitter_cuts_at_every_added_token_the_tokenizer_matches(spec: str) -> None:
    tokenizer = TOKENIZERS[spec]
    added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    splitter = Splitter(tokenizer)
    text = "".join(added) + "x" + "".join(reversed(list(added)))
    ids = [p for p in splitter.pieces(text) if isinstance(p, int)]
    assert ids == [i for i in whole(spec, text) if i in added.values()]


@pytest.mark.parametrize("spec", SPECS)
def test_growing_templated_conversations_match_whole_encoding_and_reuse_the_cache(
    spec: str, tmp_path: Path
) -> None:
    counter = templated_counter(spec, tmp_path)
    assert counter._template is not None
    rng = random.Random(f"turns {spec}")
    for _ in range(12):
        messages = conversation(rng, rng.randint(1, 8))
        tools = TOOLS if rng.random() < 0.5 else None
        for end in range(1, len(messages) + 1):
            body: dict[str, Any] = {"messages": messages[:end], "tools": tools}
            text = counter._template(body)
            before = counter.encoder.encoded_chars
            assert counter.ids_now("chat", body) == whole(spec, text)
            new_chars = counter.encoder.encoded_chars - before
            # Only the newest message (and the generation prompt) is encoded again.
            newest = json.dumps(messages[end - 1], ensure_ascii=False)
            assert new_chars <= len(newest) + 200
            assert counter.count_now("chat", body) == len(whole(spec, text))
        # The same conversation again: nothing left to encode.
        before = counter.encoder.encoded_chars
        counter.ids_now("chat", body)
        assert counter.encoder.encoded_chars == before


@pytest.mark.parametrize("spec", SPECS)
def test_the_approximate_rendering_encoded_by_parts_matches_its_whole_text(spec: str) -> None:
    counter = PromptCounter(load_tokenizer(spec, base_dir=ROOT), Path("/nonexistent/t.json"))
    assert counter._template is None
    rng = random.Random(f"approximate {spec}")
    for _ in range(40):
        body = {"messages": conversation(rng, rng.randint(1, 6)), "tools": TOOLS}
        expected = whole(spec, render_chat(body))
        assert counter.ids_now("chat", body) == expected
        assert counter.count_now("chat", body) == len(expected)
        assert counter.count_now("chat", body, cap=5) >= 5


def test_a_tokenizer_whose_added_tokens_strip_their_neighbours_is_encoded_whole() -> None:
    state = json.loads(TOKENIZERS["sim/fixtures/glm"].to_str())
    for token in state["added_tokens"]:
        if token["content"] == "<|user|>":
            token["lstrip"] = True
    stripping = tokenizers.Tokenizer.from_str(json.dumps(state))
    encoder = SegmentEncoder(stripping)
    assert not encoder.exact
    text = "Hi there   <|user|>\nhello"
    expected = stripping.encode(text, add_special_tokens=False).ids
    assert encoder.ids([text]) == expected
    assert len(encoder.cache) == 0


def test_a_metaspace_tokenizer_is_not_split() -> None:
    state = json.loads(TOKENIZERS["sim/fixtures/glm"].to_str())
    state["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}
    assert not split_is_exact(tokenizers.Tokenizer.from_str(json.dumps(state)))


def test_the_cache_stays_within_its_bound_over_100k_distinct_prompts() -> None:
    cache = segments.SegmentCache()
    tracemalloc.start()
    try:
        for i in range(100_000):
            key = hashlib.blake2b(f"prompt {i}".encode(), digest_size=16).digest()
            cache.put(key, array("i", range(i % 97)))
            assert cache.charged <= cache.max_tokens
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(cache) < 100_000  # it evicted
    assert held < 5 * segments.MAX_CACHED_TOKENS  # bytes: about 20 MB at most


def test_an_encoder_keeps_its_cache_within_its_bound() -> None:
    encoder = SegmentEncoder(TOKENIZERS["deepseek"], max_cached_tokens=50_000)
    cache = encoder.cache
    for batch in range(10):
        # 1,000 distinct prompts a call, as pieces between special tokens
        prompts = [f"prompt {batch * 1000 + i}: {i * 7919} words" for i in range(1000)]
        encoder.ids(["<｜User｜>".join(prompts)])
        assert cache.charged <= cache.max_tokens
    assert 500 < len(cache) <= cache.max_tokens // segments.ENTRY_COST


def test_a_piece_larger_than_the_whole_cache_is_not_kept() -> None:
    encoder = SegmentEncoder(TOKENIZERS["deepseek"], max_cached_tokens=1_000)
    text = "word " * 5_000
    assert encoder.count([text]) == len(whole("deepseek", text))
    assert len(encoder.cache) == 0 and encoder.cache.charged == 0


def test_a_hostile_10_mb_prompt_counted_with_a_cap_stops_early() -> None:
    encoder = SegmentEncoder(TOKENIZERS["deepseek"])
    text = "Prefill and decode run apart 预填充 🙂 " * 300_000  # ~10 MB
    assert encoder.count([text], cap=10_000) >= 10_000
    assert encoder.encoded_chars <= 2 * segments.BATCH_CHARS


def test_a_hostile_prompt_of_special_token_text_counted_with_a_cap_stops_early() -> None:
    encoder = SegmentEncoder(TOKENIZERS["sim/fixtures/glm"])
    text = "<|user|>x" * 1_200_000  # ~10 MB, 2.4M pieces
    assert encoder.count([text], cap=10_000) >= 10_000
    assert encoder.encoded_chars < 100
    assert len(encoder.cache) == 1  # "x"


def test_10000_messages_are_counted_with_a_cap_and_within_the_bound() -> None:
    counter = PromptCounter(
        load_tokenizer("sim/fixtures/glm", base_dir=ROOT),
        tokenizer_path("sim/fixtures/glm", base_dir=ROOT),
    )
    messages = [{"role": "user", "content": f"message {i} " * 20} for i in range(10_000)]
    body = {"messages": messages}
    assert counter.count_now("chat", body, cap=20_000) >= 20_000
    assert counter.encoder.encoded_chars <= 2 * segments.BATCH_CHARS
    assert counter.encoder.cache.charged <= counter.encoder.cache.max_tokens


def test_encodings_in_threads_share_the_cache_safely() -> None:
    spec = "deepseek"
    encoder = SegmentEncoder(TOKENIZERS[spec], max_cached_tokens=20_000)  # evicting
    rng = random.Random("threads")
    texts = [
        "<｜User｜>".join(random_text(rng, 30) for _ in range(rng.randint(1, 30)))
        for _ in range(40)
    ]
    expected = [whole(spec, text) for text in texts]

    def run(seed: int) -> bool:
        order = random.Random(seed).sample(range(len(texts)), len(texts))
        return all(encoder.ids([texts[i]]) == expected[i] for i in order * 2)

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(run, range(8)))
    assert encoder.cache.charged <= encoder.cache.max_tokens
    assert encoder.cache.charged == sum(
        len(ids) + segments.ENTRY_COST for ids in encoder.cache._entries.values()
    )


@pytest.mark.parametrize(
    ("normalised", "raw", "expected"),
    [
        (["<think>"], ["<|user|>"], False),
        (["｜DSML｜"], ["<｜/table>｜"], False),  # the raw token starts first: it wins anyway
        (["<ab"], ["b>"], True),  # "<ab>": one pass would take "<ab" where "b>" came first
        (["<abc>"], ["abc"], True),
        (["<x>"], ["<x>"], True),
    ],
)
def test_a_normalised_token_that_could_take_a_raw_ones_place_is_found(
    normalised: list[str], raw: list[str], expected: bool
) -> None:
    assert pre_empts(normalised, raw) is expected


def test_a_tokenizer_whose_normalised_tokens_could_take_others_places_is_encoded_whole() -> None:
    state = json.loads(TOKENIZERS["sim/fixtures/glm"].to_str())
    state["added_tokens"].append(
        {
            "id": 151400,
            "content": "ab<|user|",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": True,
            "special": False,
        }
    )
    assert not split_is_exact(tokenizers.Tokenizer.from_str(json.dumps(state)))


@pytest.mark.parametrize("spec", SPECS)
def test_tokens_astride_the_scanning_windows_are_found(spec: str) -> None:
    tokenizer = TOKENIZERS[spec]
    token = "<think>"
    token_id = tokenizer.token_to_id(token)
    text = ""
    for boundary in range(1, 4):  # a token ending just before, across, just after each
        for offset in (-len(token), -3, 0):
            text += "x" * (boundary * segments.SCAN_CHARS + offset - len(text)) + token
    pieces = list(Splitter(tokenizer).pieces(text))
    assert pieces.count(token_id) == 9
    rebuilt = "".join(p if isinstance(p, str) else token for p in pieces)
    assert rebuilt == text
    assert all(len(p) <= segments.SLICE_CHARS for p in pieces if isinstance(p, str))
