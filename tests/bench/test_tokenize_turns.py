"""A brief run of the turn-by-turn encoding experiment: both ways give the same ids, and
with the cache a later turn encodes only what it adds."""

from __future__ import annotations

from bench.experiments import tokenize_turns


def test_a_brief_run_reports_every_turn_and_the_cache_saves_on_later_turns() -> None:
    sizes = "--until 3000 --long-first 12000 --repeats 1 --tokenizers deepseek"
    args = tokenize_turns.parser().parse_args(sizes.split())
    results = tokenize_turns.run(args)  # exits if the cached ids differ from the whole ones

    assert [title for title, _ in results] == [
        "deepseek, short first message:",
        "deepseek, long first message:",
    ]
    _, long_history = results[1]
    assert len(long_history) >= 3
    first, *later = long_history
    assert first.prompt_tokens > 12_000
    for turn in later:
        assert 0 < turn.new_tokens < turn.prompt_tokens / 5
    # A later turn's cached encoding costs less than encoding its whole prompt: over the
    # turns together, so that one turn's noise on a busy machine cannot fail the test.
    assert sum(t.cached_ms for t in later) < sum(t.whole_ms for t in later)
    report = tokenize_turns.report("deepseek", long_history)
    assert "ms cached" in report and "turns after the first" in report
