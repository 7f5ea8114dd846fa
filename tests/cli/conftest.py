"""The CLI's commands run in-process here, and `classify` and `check` load the model's
tokenizer on every call (half a second of CPU): a module loads each tokenizer file once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from router.runtime import epoch
from router.tokens.tokenizer import LoadedTokenizer, tokenizer_path


@pytest.fixture(scope="module", autouse=True)
def each_tokenizer_loaded_once() -> Iterator[None]:
    load = epoch.load_tokenizer
    loaded: dict[Path, LoadedTokenizer] = {}

    def load_once(spec: str, *, base_dir: Path) -> LoadedTokenizer:
        path = tokenizer_path(spec, base_dir=base_dir)
        if path not in loaded:
            loaded[path] = load(spec, base_dir=base_dir)
        return loaded[path]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(epoch, "load_tokenizer", load_once)
        yield
