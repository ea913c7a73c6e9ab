"""The domain tokenizer of the default LM agent: a byte-level BPE trained with `tokenizers` (docs/agents.md).

It is trained on the text the agent actually sees and writes: catalog titles, descriptions, attributes and
options, the shopping env's action grammar (``search[...]``, ``click[...]``, JSON tool calls) and observation
renderings. Digits are split one by one so that prices and SKUs are spelled with a small, shared set of tokens
(the model compares prices and copies SKUs digit by digit). Byte-level BPE makes ``decode(encode(text)) == text``
for every string, which the round-trip test checks on catalog text.

Special tokens mark roles and turn ends; the chat template renders a dialogue as::

    <|system|>TEXT<|end|><|user|>OBSERVATION<|end|><|assistant|>ACTION<|end|>...

with no whitespace between segments, so that tokenising one segment at a time gives exactly the ids of tokenising
the whole dialogue (special tokens always split the text). ``<|end|>`` is also the end-of-action token: the sampler
stops when the model generates it. The result is an ordinary `transformers.PreTrainedTokenizerFast`
(``save_pretrained`` / ``from_pretrained``; ``apply_chat_template`` works).

The shipped default lives in ``data/lm/tokenizer``; `build_default_tokenizer` re-creates it (needs the catalog
and, for observation renderings, the shopping env and its expert).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

PAD, SYSTEM, USER, ASSISTANT, END = "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [PAD, SYSTEM, USER, ASSISTANT, END]

#: Jinja chat template of the default tokenizer (no whitespace between segments: see module docstring).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

#: Action grammar samples, so that the grammar's brackets and verbs are single tokens.
GRAMMAR_SAMPLES = [
    "search[{q}]", "click[{q}]", "click[buy now]", "click[add to cart]", "click[description]", "click[next >]",
    "click[< prev]", "click[back to search]", "click[checkout]", "back", "next_page", "prev_page", "ask[{q}]",
    "answer[{q}]", "buy", "add_to_cart", "remove_from_cart[{q}]", "view_cart", "checkout", "list_orders",
    "get_order[{q}]", "cancel_order[{q}, no longer needed]", "return_item[{q}]", "exchange_item[{q}]", "finish",
    '{{"name": "search", "arguments": {{"query": "{q}"}}}}', '{{"name": "click", "arguments": {{"target": "{q}"}}}}',
]


def grammar_texts(words: Iterable[str]) -> Iterator[str]:
    """Action-grammar strings filled with `words` (one sample per template and word)."""
    for w in words:
        for template in GRAMMAR_SAMPLES:
            yield template.format(q=w)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, *, min_frequency: int = 2):
    """Train the byte-level BPE on `texts` and wrap it as a `PreTrainedTokenizerFast` with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok):
    """A `tokenizers.Tokenizer` with our special tokens -> `PreTrainedTokenizerFast` with the chat template."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=END, padding_side="left",
        model_max_length=8192, clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": [SYSTEM, USER, ASSISTANT]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def default_tokenizer_dir() -> Path:
    from shopsim.paths import data_dir

    return data_dir() / "lm" / "tokenizer"


def load_tokenizer(path: str | Path | None = None):
    """Load a tokenizer folder (default: the shipped domain tokenizer). Nothing is downloaded."""
    from transformers import AutoTokenizer

    from shopsim.errors import ShopsimError

    path = Path(path) if path is not None else default_tokenizer_dir()
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise ShopsimError(f"no tokenizer in {path}; run `python -m agents.lm.tokenizer --out {path}` to build it")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok.padding_side = "left"
    return tok


def catalog_texts(catalog, limit: int | None = None) -> Iterator[str]:
    """Catalog text fields, one string per product field (titles, descriptions, attributes, options)."""
    cols = catalog.table.to_pydict() if limit is None else catalog.table.slice(0, limit).to_pydict()
    for i in range(len(cols["title"])):
        yield cols["title"][i]
        yield cols["description"][i]
        yield f"{cols['category'][i]} {cols['product_type'][i]} {cols['brand'][i]} ${cols['price'][i]:.2f}"
        yield " ".join(cols["attributes"][i])
        for name, values in zip(cols["option_names"][i], cols["option_values"][i], strict=False):
            yield f"{name}: {', '.join(values)}"


def observation_texts(env_id: str, episodes: int = 200, seed: int = 0) -> Iterator[str]:
    """Observation renderings and expert actions from scripted-expert episodes of `env_id`."""
    import agents
    from shopsim.rollout import collect

    expert = agents.make("expert", env_id)
    trajs = collect(env_id, expert, episodes=episodes, seeds=list(range(seed, seed + episodes)), split="train",
                    progress=False)
    for traj in trajs:
        for turn in traj.turns:
            yield str(turn.observation)
            yield str(turn.action)


def build_default_tokenizer(out: str | Path | None = None, *, vocab_size: int = 4096, catalog_size: int = 10_000,
                            env_id: str = "shopsim/Shopping-v0", episodes: int = 200, seed: int = 0):
    """Re-create the shipped tokenizer: catalog text + grammar + observations, saved with `save_pretrained`."""
    from shopsim.catalog import load_catalog

    cat = load_catalog(size=catalog_size, seed=seed)
    texts = list(catalog_texts(cat))
    words = sorted({w for t in texts[: 5 * 2000] for w in t.split()[:3]})[:3000]
    texts += list(grammar_texts(words))
    obs = list(observation_texts(env_id, episodes=episodes, seed=seed)) if episodes > 0 else []
    texts += obs * 3  # observations are what the model reads most: weight them up
    tok = train_tokenizer(texts, vocab_size=vocab_size)
    out = Path(out) if out is not None else default_tokenizer_dir()
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return tok


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    import argparse

    p = argparse.ArgumentParser(description="Build the default domain tokenizer of the LM agent.")
    p.add_argument("--out", default=None)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--episodes", type=int, default=200)
    a = p.parse_args()
    t = build_default_tokenizer(a.out, vocab_size=a.vocab_size, episodes=a.episodes)
    print(f"vocab {len(t)} -> {a.out or default_tokenizer_dir()}")
