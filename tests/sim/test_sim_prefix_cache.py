"""The simulated server's prefix cache: chained block hashes, hits, LRU eviction."""

from sim.vllm.prefix_cache import PrefixCache, block_hashes


def test_a_block_hash_covers_its_whole_prefix() -> None:
    first = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    other_parent = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(first) == 2  # the partial last block is not hashed
    assert first[1] != other_parent[1]  # same tokens 5..8, different parent
    assert block_hashes([1, 2, 3, 4], 4) == first[:1]


def test_hits_are_the_leading_cached_blocks_short_of_the_last_token() -> None:
    cache = PrefixCache(block_size=4, num_blocks=100)
    assert cache.admit(list(range(10))).cached_tokens == 0
    assert cache.admit(list(range(10))).cached_tokens == 8
    assert cache.admit(list(range(12))).cached_tokens == 8  # token 11 must be computed
    assert cache.admit(list(range(13))).cached_tokens == 12
    assert cache.admit([99, *range(1, 13)]).cached_tokens == 0  # a different first block


def test_admission_reports_stored_blocks() -> None:
    cache = PrefixCache(block_size=4, num_blocks=100)
    hashes = block_hashes(list(range(9)), 4)
    assert cache.admit(list(range(9))).stored == hashes
    assert cache.admit(list(range(9))).stored == []
    assert len(cache) == 2


def test_least_recently_used_blocks_are_evicted_first() -> None:
    cache = PrefixCache(block_size=2, num_blocks=4)
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    cache.admit(a)
    cache.admit(b)
    cache.admit([*a, 0])  # touches a's blocks: b is now the oldest
    admission = cache.admit(c)
    assert admission.evicted == block_hashes(b, 2)
    assert len(cache) == 4
    assert cache.admit([*a, 0]).cached_tokens == 4
    assert cache.admit([*b, 0]).cached_tokens == 0


def test_clear_forgets_everything() -> None:
    cache = PrefixCache(block_size=2, num_blocks=4)
    cache.admit([1, 2, 3])
    assert cache.clear() == 1
    assert cache.admit([1, 2, 3]).cached_tokens == 0
