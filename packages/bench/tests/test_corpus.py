import random

import pytest
from sparkinfer.bench import corpus
from sparkinfer.bench.errors import DatasetError


def test_shipped_data_loads():
    assert len(corpus.words()) > 200
    assert len(corpus.read_data("prose.txt")) > 150_000  # > 32K tokens of prose
    names = [w.name for w in corpus.workload_prompts(0)]
    assert names == ["chat", "code", "math", "json", "repetition"]


def test_workload_prompts_are_stable_and_distinct_per_run():
    a, b = corpus.workload_prompts(0), corpus.workload_prompts(1)
    assert [w.prompt for w in a] == [w.prompt for w in corpus.workload_prompts(0)]
    pairs = zip(a, b, strict=True)
    assert all(x.prompt != y.prompt and x.prompt[10:] == y.prompt[10:] for x, y in pairs)
    assert all(w.max_tokens == 128 for w in a)
    with pytest.raises(DatasetError, match="unknown"):
        corpus.workload_prompts(0, ("nope",))


def test_cut_ends_on_a_boundary_and_repeats():
    text = corpus.prose(5000)
    assert 2500 < len(text) <= 5001 and text.endswith(("\n", ". "))
    assert len(corpus.prose(400_000)) > 350_000  # repeats past the shipped text
    assert corpus.cut("abc", 10, repeat=True).startswith("abcabcabc")


def test_random_prompts_are_unique_per_request():
    p = [corpus.random_prompt(50, i, seed=3, tokens_per_word=1.0) for i in range(20)]
    assert len(set(p)) == 20 and all(40 <= len(x.split()) <= 52 for x in p)
    assert corpus.random_prompt(50, 7, 3, 1.0) == p[7]
    assert corpus.random_words(3, random.Random(0)) == corpus.random_words(3, random.Random(0))


def test_load_dataset(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('"a"\n\n{"prompt": "b"}\n{"messages": [{"role": "user", "content": "c"}]}\n')
    items = corpus.load_dataset(path)
    assert [i.prompt for i in items] == ["a", "b", None] and items[2].messages
    path.write_text('{"text": 1}\n')
    with pytest.raises(DatasetError, match="line 1 has neither"):
        corpus.load_dataset(path)
    with pytest.raises(DatasetError, match="cannot be read"):
        corpus.load_dataset(tmp_path / "missing.jsonl")
