"""The default causal LM of the LM agent: a small model built from a config (docs/agents.md).

The default ("mini") is a Llama-architecture decoder (RoPE, so the context length is a config value, not a learned
table): width 128, 4 layers, 4 heads, SwiGLU 384, tied input/output embeddings, about 1.3 million parameters (half of
them the 4,096-token embedding), sized for CPU training (SFT in minutes on two cores). "small" (width 256, 4.2M) and
"medium" are there for machines with more compute. Any other `transformers` causal LM works with the agent;
`build_model(..., arch="gpt2")` builds a GPT-2 of the same size, which the architecture-independence test uses. Models
are saved with ``save_pretrained`` (safetensors) and reloaded with ``AutoModelForCausalLM.from_pretrained`` — ordinary
Hugging Face checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

from shopsim.errors import ConfigError, ShopsimError
from shopsim.paths import atomic_files

ARCHS = ("llama", "gpt2")


@dataclass
class ModelSize:
    """Width/depth of a from-scratch model."""

    hidden: int = 256
    """Model width (embedding size)."""
    layers: int = 4
    """Number of transformer blocks."""
    heads: int = 4
    """Attention heads (hidden must be divisible by heads)."""
    ffn: int = 688
    """Feed-forward width (Llama: SwiGLU intermediate size; GPT-2: n_inner)."""
    max_positions: int = 4096
    """Longest context (prompt + generated tokens) the model is configured for."""

    def __post_init__(self) -> None:
        if min(self.hidden, self.layers, self.heads, self.ffn, self.max_positions) <= 0:
            raise ConfigError(f"model sizes must be positive, got {self}")
        if self.hidden % self.heads:
            raise ConfigError(f"hidden={self.hidden} must be divisible by heads={self.heads}")


#: named sizes; DEFAULT_SIZE is the LM agent's default, "tiny" is for tests.
SIZES = {
    "tiny": ModelSize(hidden=32, layers=2, heads=2, ffn=64, max_positions=4096),
    "mini": ModelSize(hidden=128, layers=4, heads=4, ffn=384, max_positions=4096),
    "small": ModelSize(),
    "medium": ModelSize(hidden=384, layers=6, heads=6, ffn=1024, max_positions=4096),
}


DEFAULT_SIZE = "mini"


def make_config(tokenizer, *, arch: str = "llama", size: str | ModelSize = DEFAULT_SIZE):
    """A `transformers` config for a from-scratch model whose vocabulary and special ids match `tokenizer`."""
    if arch not in ARCHS:
        raise ConfigError(f"arch={arch!r}; choose one of {ARCHS}")
    if isinstance(size, str):
        if size not in SIZES:
            raise ConfigError(f"size={size!r}; choose one of {sorted(SIZES)} or pass a ModelSize")
        size = SIZES[size]
    vocab = len(tokenizer)
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
               bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=vocab, hidden_size=size.hidden, intermediate_size=size.ffn,
                           num_hidden_layers=size.layers, num_attention_heads=size.heads,
                           num_key_value_heads=size.heads, max_position_embeddings=size.max_positions,
                           tie_word_embeddings=True, **ids)
    from transformers import GPT2Config

    return GPT2Config(vocab_size=vocab, n_embd=size.hidden, n_layer=size.layers, n_head=size.heads,
                      n_inner=size.ffn, n_positions=size.max_positions, tie_word_embeddings=True, **ids)


def build_model(tokenizer, *, arch: str = "llama", size: str | ModelSize = DEFAULT_SIZE, seed: int = 0):
    """A randomly initialised causal LM (seeded) for `tokenizer`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = make_config(tokenizer, arch=arch, size=size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model


def load_model(path, *, dtype=None):
    """Load a local checkpoint folder (never downloads). Damaged weights (a file cut short by a kill or an
    interrupted copy) raise a `ShopsimError` naming the folder."""
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype or torch.float32)
    except SafetensorError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShopsimError(f"{path}: the model weights are damaged ({reason}); copy or save the checkpoint "
                           "again") from None


def export_checkpoint(src, dst, *, dtype: str = "bfloat16"):
    """Copy the checkpoint folder `src` (model, tokenizer, shopsim manifest) to `dst` with its weights stored in
    `dtype`: a bfloat16 copy takes half the bytes of float32, which is how a larger shipped model stays small.
    `load_model` reads it back in float32 (the bfloat16 values, exactly). The manifest records the source and the
    storage dtype under ``"export"``. `dst` is replaced as a whole: the copy is written next to it, then renamed."""
    import json
    import shutil
    from pathlib import Path

    import torch

    if dtype not in ("bfloat16", "float16", "float32"):
        raise ConfigError(f"dtype={dtype!r}; choose bfloat16, float16 or float32")
    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise ConfigError(f"{src}: not a model folder (no config.json)")
    tmp = dst.with_name(dst.name + ".export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.pt"))
    with atomic_files(tmp) as files:  # the normal file mode (safetensors makes its files private)
        load_model(src, dtype=getattr(torch, dtype)).save_pretrained(str(files), safe_serialization=True)
    manifest = tmp / "shopsim_agent.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        m["export"] = {"from": str(src), "dtype": dtype}
        manifest.write_text(json.dumps(m, indent=2, sort_keys=True))
    old = dst.with_name(dst.name + ".export-old")
    if dst.exists():
        dst.rename(old)
    tmp.rename(dst)
    shutil.rmtree(old, ignore_errors=True)
    return dst


def weights_digest(path) -> str:
    """sha256 (16 hex digits) of a checkpoint folder's weight files: which weights a run started from."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")) or sorted(Path(path).glob("*.bin")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def context_length(model) -> int:
    """The longest sequence the model's config allows (for prompt budgeting)."""
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
