"""A tiny Llama-style model that real vLLM serves on a CPU in seconds, built offline.

Its tokenizer is a byte-level BPE trained here with ``tokenizers`` on a fixed corpus (so
the same ids on every machine), with a chat template that renders tools and tool calls.
There are no weights: vLLM runs it with ``--load-format dummy`` (random weights from a
fixed seed), so what it says is noise, but every field around the text is vLLM's own.

    python -m tests.support.tiny_model DIR    # writes the model into DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

NAME = "tiny-llama"
BOS, EOS = "<s>", "</s>"
SPECIAL_TOKENS = [
    BOS,
    EOS,
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
]
VOCAB_SIZE = 1024
MAX_MODEL_LEN = 2048

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\nYou may call these tools:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "<tool_call>{{ {'name': call['function']['name'],"
    " 'arguments': call['function']['arguments']} | tojson }}</tool_call>"
    "{% endfor %}{% endif %}"
    "\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog while the weather in Paris stays mild.",
    "Tell me a story about a city, a river and a bridge that nobody crossed.",
    "You may call these tools: get_weather, search, calculator, translate.",
    '{"type": "function", "function": {"name": "get_weather", "parameters": {}}}',
    '{"city": "Paris", "unit": "celsius", "days": 3, "ok": true, "list": [1, 2, 3]}',
    "Answer briefly. Summarise the text. Explain why the sky is blue at noon.",
    "Plain prose with café, naïve and 速度, then an emoji 🌍 and the end.",
    "system user assistant tool critic reviewer: hello, world! 0123456789 + - * / = ?",
]


def build_tokenizer() -> Tokenizer:
    """Train the byte-level BPE; the same corpus gives the same vocabulary every time."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tokenizer


def model_config(vocab_size: int, bos_id: int, eos_id: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_MODEL_LEN,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }


def write_model(directory: Path, tokenizer_dir: Path | None = None) -> Path:
    """Write config, tokenizer and chat template into ``directory``; return it.

    ``tokenizer_dir``: a shipped tokenizer (tokenizer.json and tokenizer_config.json, with
    its own chat template) instead of the one trained here; the vocabulary covers its ids."""
    directory.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        return _write_with_tokenizer(directory, tokenizer_dir)
    tokenizer = build_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    files = {
        "config.json": model_config(tokenizer.get_vocab_size(), bos_id, eos_id),
        "generation_config.json": {"bos_token_id": bos_id, "eos_token_id": eos_id},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "model_max_length": MAX_MODEL_LEN,
            "add_bos_token": False,
            "chat_template": CHAT_TEMPLATE,
        },
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content, indent=2) + "\n")
    return directory


def _write_with_tokenizer(directory: Path, tokenizer_dir: Path) -> Path:
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    shutil.copyfile(tokenizer_dir / "tokenizer.json", directory / "tokenizer.json")

    def token_id(field: str) -> int:
        token = config.get(field)
        found = tokenizer.token_to_id(token) if isinstance(token, str) else None
        return found if found is not None else 0

    bos_id, eos_id = token_id("bos_token"), token_id("eos_token")
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    files = {
        # Its ids need not be dense (GLM's special tokens sit far above its vocabulary).
        "config.json": model_config(max(vocab.values()) + 1, bos_id, eos_id),
        "generation_config.json": {"bos_token_id": bos_id, "eos_token_id": eos_id},
        "tokenizer_config.json": {**config, "model_max_length": MAX_MODEL_LEN},
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content, indent=2) + "\n")
    return directory


if __name__ == "__main__":
    print(write_model(Path(sys.argv[1])))
