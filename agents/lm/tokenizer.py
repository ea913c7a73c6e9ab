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

The template (`chat_template`) is self-contained for plain ``transformers`` users: a dialogue without a system
message gets the agent's default one (`agents.lm.prompts.DEFAULT_SYSTEM`, or the system prompt the checkpoint was
trained with: `LMAgent.save` writes it in), so ``apply_chat_template([user message], add_generation_prompt=True)``
gives the prompt the agent builds. OpenAI-style assistant ``tool_calls`` are rendered as the JSON action the env
accepts (``{"name": "search", "arguments": {"query": "..."}}``) and ``tool`` messages (the pages they return) as
user messages, which is how the model sees them while acting; so a tool-call dialogue
(`shopsim.integrations.trl.sft_dataset`) trains on the actions instead of on empty assistant messages.

The shipped default lives in ``data/lm/tokenizer``; `build_default_tokenizer` re-creates it (needs the catalog
and, for observation renderings, the shopping env and its expert).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from shopsim.envs.records import SHOPPING

PAD, SYSTEM, USER, ASSISTANT, END = "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [PAD, SYSTEM, USER, ASSISTANT, END]

#: marks the templates `chat_template` writes (`is_domain_template`)
_TEMPLATE_MARK = "{#- shopsim domain chat template -#}"
#: the template of checkpoints shipped before the template got a default system message and tool calls
_PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def chat_template(system: str | None = None) -> str:
    """The Jinja chat template of the domain tokenizer, whose dialogues without a system message start with `system`
    (default: `agents.lm.prompts.DEFAULT_SYSTEM`); see the module docstring. No whitespace between segments."""
    import json

    from agents.lm.prompts import DEFAULT_SYSTEM

    # json.dumps: a valid Jinja string literal for any text (quotes, backslashes, newlines escaped)
    default = json.dumps("<|system|>" + (DEFAULT_SYSTEM if system is None else system) + "<|end|>", ensure_ascii=False)
    return (
        _TEMPLATE_MARK
        + "{%- if not messages or messages[0]['role'] != 'system' %}{{ " + default + " }}{%- endif %}"
        "{%- for message in messages %}"
        "{%- set role = 'user' if message['role'] == 'tool' else message['role'] %}"
        "{{- '<|' + role + '|>' }}"
        "{%- if message['content'] is string %}{{- message['content'] }}{%- endif %}"
        "{%- if message.get('tool_calls') %}"
        "{%- for call in message['tool_calls'] %}"
        "{%- set fn = call['function'] if call.get('function') else call %}"
        "{%- if not loop.first or (message['content'] is string and message['content']) %}{{- '\n' }}{%- endif %}"
        "{%- if fn['arguments'] is string %}"
        "{{- '{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' + fn['arguments'] + '}' }}"
        "{%- else %}{{- {'name': fn['name'], 'arguments': fn['arguments']} | tojson }}{%- endif %}"
        "{%- endfor %}"
        "{%- endif %}"
        "{{- '<|end|>' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
    )


def is_domain_template(template: str | None) -> bool:
    """Whether `template` is one the domain tokenizer ships (`chat_template`, or the plain one of older folders)."""
    return bool(template and (template.startswith(_TEMPLATE_MARK) or template == _PLAIN_TEMPLATE))


#: Jinja chat template of the default tokenizer (`chat_template` with the default system message)
CHAT_TEMPLATE = chat_template()

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
                            env_id: str = SHOPPING.id, episodes: int = 200, seed: int = 0):
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
