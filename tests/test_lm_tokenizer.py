"""The shipped domain tokenizer: lossless round trip on catalog text, single-id special tokens, chat template."""

from __future__ import annotations

import pytest

from agents.lm.tokenizer import SPECIAL_TOKENS, grammar_texts, load_tokenizer, train_tokenizer


def test_round_trip_on_catalog_text(tok):
    from shopsim.catalog import load_catalog

    cat = load_catalog(size=1000, seed=3)
    cols = cat.table.slice(0, 300).to_pydict()
    texts = cols["title"] + cols["description"] + [" ".join(a) for a in cols["attributes"]]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    # compression: the domain vocabulary should beat bytes by a wide margin on its own text
    n_chars = sum(len(t) for t in texts)
    n_tok = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert n_chars / n_tok > 3.0


@pytest.mark.parametrize("text", ["héllo wörld 🙂", "  two  spaces\n\ttab", "$1,234.56 under $30", '{"name": "x"}', ""])
def test_round_trip_arbitrary_text(tok, text):
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_special_tokens_are_single_ids(tok):
    for s in SPECIAL_TOKENS:
        assert len(tok(s, add_special_tokens=False)["input_ids"]) == 1
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|end|>"


def test_chat_template(tok):
    text = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|system|>S<|end|><|user|>U<|end|><|assistant|>"
    # without a system message, the agent's default one (plain transformers users get the agent's prompt)
    from agents.lm.prompts import DEFAULT_SYSTEM

    text = tok.apply_chat_template([{"role": "user", "content": "U"}], tokenize=False, add_generation_prompt=True)
    assert text == f"<|system|>{DEFAULT_SYSTEM}<|end|><|user|>U<|end|><|assistant|>"


def test_saved_checkpoint_template_carries_the_agents_system_prompt(tok, tmp_path):
    """`LMAgent.save` writes the agent's own system prompt as the template's default, quotes and newlines kept."""
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model

    system = 'Shop "carefully".\nOne action per reply.'
    LMAgent(model=build_model(tok, size="tiny", seed=0), tokenizer=tok, system_prompt=system).save(tmp_path / "c")
    saved = load_tokenizer(tmp_path / "c")
    text = saved.apply_chat_template([{"role": "user", "content": "U"}], tokenize=False, add_generation_prompt=True)
    assert text == f"<|system|>{system}<|end|><|user|>U<|end|><|assistant|>"


def test_digits_are_split(tok):
    toks = tok.tokenize("$78.99")
    assert [t for t in toks if any(c.isdigit() for c in t)] == ["7", "8", "9", "9"]


def test_train_is_deterministic_and_saves(tmp_path):
    texts = ["red yoga mat $19.99", "blue lamp", "search[red mat]"] * 20 + list(grammar_texts(["red", "mat"]))
    a = train_tokenizer(texts, vocab_size=400)
    b = train_tokenizer(texts, vocab_size=400)
    assert a.get_vocab() == b.get_vocab()
    a.save_pretrained(str(tmp_path))
    c = load_tokenizer(tmp_path)
    assert c("search[red mat]", add_special_tokens=False)["input_ids"] == \
        a("search[red mat]", add_special_tokens=False)["input_ids"]
