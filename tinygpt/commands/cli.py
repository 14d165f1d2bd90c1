"""The command line: tinygpt train | plan | eval | sample | chat | inspect | info | tune | prepare | import-hf | export.

Errors are one line on stderr with a non-zero exit code; --debug shows the traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..core.version import __version__
from ..files import checkpoint as ckpt
from .argtypes import flag, nonneg_float, positive_float, positive_int, seed_int
from ..core.config import n_params
from ..core.errors import TinyGPTError, UsageError, set_wording, word
from ..core.fs import writes_shown
from ..core.precision import PRECISIONS
from ..device.gpu import GPU
from ..device.tune import tune
from ..device.tuning import reset_tuning
from .export import export
from ..files.gguf_read import gguf_file
from ..files.hf import import_hf
from ..files.hf_read import shard_files
from .info import info
from ..run.infer import evaluate, sample
from ..files.gguf_write import TYPES as GGUF_TYPES
from .chat import CHAT, CHAT_HELP, CHAT_PRECISION, cmd_chat
from .lens import inspect
from .. import tokenizers
from ..model import budget
from ..run.options import EvalOptions, ExportOptions, InspectOptions, SampleOptions, TrainOptions
from ..files.outputs import Outputs, os_error_text
from .tables import emit
from ..run.safety import Interrupted, stops_on_signals
from ..files.tokenfile import data_files, is_our_sidecar, is_our_token_file, prepare, sidecar_of
from ..run.recipe import run_budget
from ..run.train import profile, train
from .settings import ONE_OF, Parser, add_flags, default, flag_of, options, read_config, settings_argv, train_flags

EXIT_ERROR, EXIT_INTERRUPT = 1, 130
EXIT_BROKEN_PIPE = 128 + 13   # what a process killed by SIGPIPE returns, as `head` leaves a Unix tool
EXIT_DOES_NOT_FIT = 4          # tinygpt plan: the run it describes would be refused (docs/usage.md)
# import-hf's --dtype: the file's weightDtype, and what the file holds
IMPORT_DTYPES = {"f32": ("fp32", "float32 weights alone"), "f16": ("fp16", "float16 weights alone"),
                 "bf16": ("bf16", "bfloat16 weights alone")}


# ---- commands ----------------------------------------------------------------------------------
def cmd_info(args) -> int:
    print(info(args.model, args.json, args.brief))
    return 0


def cmd_export(args) -> int:
    with writes_shown(not args.quiet):
        export(options(ExportOptions, args))
    print(f"wrote {args.out} ({args.format})", file=sys.stderr)
    return 0


def cmd_train(args) -> int:
    o = options(TrainOptions, args)
    if args.profile:
        print(profile(o, as_json=args.json))
        return 0
    if args.json:
        raise UsageError("--json goes with --profile (its rows as JSON Lines)")
    train(o)
    return 0


def cmd_plan(args) -> int:
    gpu, kernel_plan, mem, fitting = run_budget(options(TrainOptions, args), args.kernels)
    if args.json:
        d = mem.as_dict()
        d["adapter"] = f"{gpu.name} ({gpu.backend})"
        if not mem.fits:
            d["fitting_batch"], d["fitting_grad_accum"] = fitting
        print(json.dumps(d, indent=2))
    else:
        print(f"# {gpu.name} ({gpu.backend})\n" + budget.text(mem))
    if mem.fits:
        return 0
    sys.stdout.flush()
    print(f"tinygpt: {word(budget.refusal(mem, kernel_plan))}", file=sys.stderr)
    return EXIT_DOES_NOT_FIT


def cmd_eval(args) -> int:
    r = evaluate(options(EvalOptions, args))
    if args.json:
        print(json.dumps(r))
    else:
        if "reward_accuracy" in r:
            print(f"DPO loss {r['loss']:.4f} over {r['pairs']:,} pairs (beta {r['beta']:g}): reward accuracy "
                  f"{r['reward_accuracy']:.3f}, margin {r['reward_margin']:+.4f} (chosen {r['chosen_reward']:+.4f}, "
                  f"rejected {r['rejected_reward']:+.4f}), of {r['data']}")
            return 0
        ppl = f"perplexity {r['perplexity']:.2f}" if r["perplexity"] is not None else "perplexity too large to show"
        b = f", {r['bits_per_byte']:.3f} bits/byte" if "bits_per_byte" in r else ""
        print(f"validation loss {r['loss']:.4f} nats{b} ({ppl}) over {r['windows']} windows of {r['ctx']:,}, "
              f"{r['tokens']:,} tokens of {r['data']}")
    return 0


def cmd_sample(args) -> int:
    texts = sample(options(SampleOptions, args))
    for i, text in enumerate(texts):
        if len(texts) > 1:
            sys.stdout.write(f"---- sample {i + 1} of {len(texts)} ----\n")
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_inspect(args) -> int:
    _, table = inspect(options(InspectOptions, args))
    print("logit lens: the top next-token guess of each layer's residual stream\n" + table)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cmd_prepare(args) -> int:
    with stops_on_signals() as stop:
        try:
            return _prepare(args)
        except KeyboardInterrupt:
            print(f"tinygpt: prepare stopped by {stop.name}; nothing was written ({args.out} is as it was)",
                  file=sys.stderr)
            return stop.exit_code


def _prepare(args) -> int:
    inputs = {f"text {i + 1}": data_files(t) for i, t in enumerate(args.text)}
    out = Outputs(args.force, {**inputs, "tokenizer_file": args.tokenizer_file, "model": args.model})
    out.claim(args.out, "out", "token file", is_our_token_file)
    out.claim(sidecar_of(args.out), "out", "token file's sidecar", is_our_sidecar)
    if args.model and args.tokenizer:
        raise UsageError("{opt:model} tokenizes with that model's own tokenizer: drop {opt:tokenizer}")
    tok = ckpt.tokenizer_of_file(args.model, f"{{opt:model}} {args.model}") if args.model else \
        (args.tokenizer or tokenizers.DEFAULT)
    side = prepare(args.text, args.out, tok, args.tokenizer_file, show_progress=not args.quiet)
    n = side["tokens"]
    print(f"wrote {args.out}: {n:,} {side['tokenizer']} tokens ({side['dtype']}, {Path(args.out).stat().st_size:,} "
          f"bytes) from {len(side['sources'])} file{'s' * (len(side['sources']) > 1)}, "
          f"{side['split']['train']:,} for training and {side['split']['val']:,} for validation; "
          f"train with: tinygpt train --data {args.out}", file=sys.stderr)
    return 0


def cmd_import_hf(args) -> int:
    d = Path(args.directory)      # the files read inside the directory are inputs as much as it is
    names = ("config.json", "model.safetensors", "model.safetensors.index.json", "vocab.json", "tokenizer.json",
             "generation_config.json", "tokenizer_config.json", "chat_template.jinja") \
        + tuple(p.name for p in shard_files(d) if d.is_dir())    # the index's shards
    inputs = {"directory": d, **{f"directory's {name}": d / name for name in names}}   # what import_hf reads
    if d.is_dir() and gguf_file(d) is not None:      # the GGUF file a directory holds is read too
        inputs["directory's GGUF file"] = gguf_file(d)
    out = Outputs(args.force, inputs).claim(args.out, "out", "checkpoint", ckpt.is_tinygpt)
    ck = import_hf(args.directory, quiet=args.quiet, ctx=args.ctx)
    ck.adam_moments = False       # the weights alone: chat, sampling and LoRA need no moments; a full
    with writes_shown(not args.quiet):      # fine-tune starts them at zero, as from a file that had them
        ckpt.save(out, ck, IMPORT_DTYPES[args.dtype][0])
    cfg = ck.cfg
    print(f"wrote {out}: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, ctx {cfg.ctx}, vocab "
          f"{cfg.vocab} ({n_params(cfg):,} parameters), activation {cfg.activation}, "
          f"tokenizer {ck.extra['tokenizer']}, {IMPORT_DTYPES[args.dtype][1]}; "
          f"block {cfg.block.describe()}; "
          f"fine-tune with: tinygpt train --resume {out} --data FILE --steps N --lr X", file=sys.stderr)
    return 0


def cmd_tune(args) -> int:
    gpu = GPU()
    if args.reset:
        print(reset_tuning(gpu.key))
        return 0
    print(f"tuning kernel variants on {gpu.name} ({gpu.backend})", file=sys.stderr)
    r = tune(gpu, quick=args.quick, log=lambda m: print(m, file=sys.stderr))
    emit(r["rows"], args.json, ["kernel", "variant", "ms", "chosen"])
    if not args.json:
        print(f"chosen: {r['chosen']} -> {r['cache'] or 'not cached (see the warning)'}")
    return 0


# ---- flags: each command's, as values (settings.add_flags builds them) ---------------------------
MODEL = flag_of("--model", required=True, help="the .tinygpt file (ours, or TinyGPT's own)")
ADAPTERS = flag_of("--adapters", metavar="DIR",
                   help="LoRA adapters from tinygpt export --format peft, folded into --model (the base they were "
                        "trained on, checked by its weights' hash; default: none)")
FORCE = flag_of("--force", action="store_true", help="replace --out even if tinygpt did not write it")
QUIET = flag_of("--quiet", action="store_true", help="no progress bar")


def sampling(precision_help: str) -> tuple:
    """What every command that samples from a model takes after its own flags: the precision, the
    attention path, the kernels, a tokenizer file and adapters."""
    return (flag_of("--precision", choices=list(PRECISIONS), default=default(SampleOptions, "precision"),
                    help=precision_help),
            "attention", "kernels", "tokenizer_file", ADAPTERS)


EVAL = (
    MODEL,
    flag_of("--data", help="a text file, a directory or a token file to take the validation split of "
                           "(default: the built-in corpus, where the model was trained on it); a chat "
                           "file (.jsonl): every record, scored on the assistant's tokens"),
    flag_of("--max-windows", type=positive_int, help="evaluate at most N windows of the split (default: all of them)"),
    flag_of("--ctx", type=positive_int,
            help="tokens a window (default: the model's context, at most 1,024, or a chat file's longest "
                 "record; never over the model's)"),
    flag_of("--truncate", action="store_true",
            help="cut a chat file's record longer than the window instead of refusing it"),
    flag_of("--dpo-beta", type=positive_float, help="a preference file's DPO beta (default 0.1)"),
    flag_of("--reference", metavar="FILE", help="a preference file's DPO reference model (default: a LoRA run's base)"),
    flag_of("--json", action="store_true", help="one JSON line instead of the sentence"),
    QUIET, "attention", "kernels",
    flag_of("--precision", choices=list(PRECISIONS), default=default(EvalOptions, "precision"),
            help="the forward's storage: bf16 and f16 store activations and weights in 16 bits (default fp32)"),
    "tokenizer_file", ADAPTERS)

SAMPLE = (
    MODEL,
    flag_of("--prompt", default=default(SampleOptions, "prompt"), help="the text to continue (default: a newline)"),
    flag_of("--tokens", type=positive_int, default=default(SampleOptions, "tokens"),
            help=f"tokens to generate (default {default(SampleOptions, 'tokens')})"),
    flag_of("--temperature", type=nonneg_float, default=default(SampleOptions, "temperature"),
            help=f"0 is greedy; higher draws more freely (default {default(SampleOptions, 'temperature')})"),
    flag_of("--top-k", type=int, help="draw from the k most likely tokens only (default: all)"),
    flag_of("--top-p", type=float, default=default(SampleOptions, "top_p"),
            help="nucleus: draw from the most likely tokens that hold this share of the probability (default 1: all)"),
    flag_of("--num-samples", type=positive_int, default=default(SampleOptions, "num_samples"),
            help="continuations of the prompt, in one batch (default 1)"),
    flag_of("--no-cache", action="store_true",
            help="recompute the whole window for every token (as --kernels decode=full)"),
    flag_of("--seed", type=seed_int, default=default(SampleOptions, "seed"),
            help="the same seed draws the same text (default 0)"),
    flag_of("--ignore-eos", action="store_true",
            help="go on past the model's end-of-turn tokens (default: a sample ends at the first, not shown)"),
    *sampling("bf16 and f16 sample from a key/value cache kept in their 16 bits (default fp32)"))

INSPECT = (
    MODEL,
    flag_of("--prompt", required=True, help="the text whose attention is drawn"),
    flag_of("--out", required=True, help="the PNG to write"),
    FORCE, "kernels", "tokenizer_file", ADAPTERS)

INFO = (
    flag_of("--model", help="describe this .tinygpt file instead (no device needed; default: the adapter)"),
    flag_of("--json", action="store_true", help="JSON instead of the text"),
    flag_of("--brief", action="store_true", help="one line: adapter (backend)"))

TUNE = (
    flag_of("--json", action="store_true", help="the measurements as JSON Lines"),
    flag_of("--quick", action="store_true", help="small shapes, one repeat"),
    flag_of("--reset", action="store_true", help="forget this adapter's cached choices and exit"))

PREPARE = (
    flag_of("text", nargs="+", help="text files, or directories of them (their files in sorted order)"),
    flag_of("--out", required=True, help="the token file (.bin) to write, its sidecar .bin.json beside it"),
    flag_of("--tokenizer", choices=list(tokenizers.NAMES),
            help=f"{tokenizers.flag_help()}; default {tokenizers.DEFAULT} (a token file holds uint16 ids "
                 "where the vocabulary fits them)"),
    flag_of("--model", help="a .tinygpt model whose own tokenizer tokenizes the text (an imported model's "
                            "tokenizer.json travels in its file); default none: --tokenizer's"),
    "tokenizer_file", FORCE, QUIET)

IMPORT_HF = (
    flag_of("directory", help="with config.json, model.safetensors (or its shards and their index) and the "
                              "tokenizer's files; or a .gguf file (llama.cpp's), or a directory holding one"),
    flag_of("--ctx", type=int, help="the context of a rotary model (Llama, Qwen): its config's "
                                    "max_position_embeddings by default; a shorter one needs less memory"),
    flag_of("--out", required=True, help="the .tinygpt to write"),
    flag_of("--dtype", choices=list(IMPORT_DTYPES), default="f32",
            help="the weights' precision in the file, the weights alone (a full fine-tune starts its "
                 "moments at zero): f32, or f16 or bf16 in half the bytes (default f32; bf16 keeps "
                 "float32's range, f16 refuses weights past 65,504)"),
    FORCE,
    flag_of("--quiet", action="store_true", help="no progress bar (shown for weights of 64 MiB or more)"))

EXPORT = (
    MODEL,
    flag_of("--format", required=True, choices=["safetensors", "hf", "gguf", "tinygpt", "tinygpt-fp16", "peft"],
            help="tinygpt-fp16: float16 weights without optimizer state, as TinyGPT's gallery ships them; "
                 "tinygpt: float32 (with --merge, a LoRA run as a plain model TinyGPT's readers compute); "
                 "peft: a LoRA run's adapters as Hugging Face PEFT's adapter directory for --format hf's model; "
                 "gguf: one file llama.cpp, Ollama and LM Studio run (a Llama, Qwen2 or Qwen3 block)"),
    flag_of("--gguf-type", choices=list(GGUF_TYPES), default=default(ExportOptions, "gguf_type"),
            help="the GGUF file's matrices (norms stay f32; default f16)"),
    flag_of("--merge", action="store_true",
            help="fold a LoRA run's adapters into the weights (W + alpha/r (B A)^T) for the other formats"),
    flag_of("--force", action="store_true", help="replace files tinygpt did not write"),
    flag_of("--quiet", action="store_true", help="no progress bar (shown for files of 64 MiB or more)"),
    "tokenizer_file",
    flag_of("out"))

DEBUG = flag_of("--debug", action="store_true", help="show tracebacks on errors")
# every command: (its help, its flags, its function); train and plan take train's flags (settings.train_flags)
COMMANDS = {
    "train": ("train a model (default: the small preset on the built-in corpus)", None, cmd_train),
    "plan": ("the memory budget of a training run (any train command's flags), buffer group by group, "
             "against this adapter's limits", None, cmd_plan),
    "eval": ("validation loss of a checkpoint", EVAL, cmd_eval),
    "sample": ("generate text from a checkpoint", SAMPLE, cmd_sample),
    "chat": (CHAT_HELP, (MODEL, *CHAT, *sampling(CHAT_PRECISION)), cmd_chat),
    "inspect": ("attention weights of every layer and head for a prompt, and a logit lens, as a PNG", INSPECT,
                cmd_inspect),
    "info": ("adapter, backend, features, limits and kernel plan; or a checkpoint with --model", INFO, cmd_info),
    "tune": ("measure kernel variants on this adapter and cache the fastest", TUNE, cmd_tune),
    "prepare": ("tokenize text files once into a token file that --data memory-maps", PREPARE, cmd_prepare),
    "import-hf": ("a Hugging Face model directory (GPT-2, Llama, Qwen2, Qwen3) or a GGUF file (Llama, "
                  "Qwen2, Qwen3) as a .tinygpt to chat with or fine-tune", IMPORT_HF, cmd_import_hf),
    "export": ("weights as safetensors (TinyGPT's names), a Hugging Face directory, a GGUF file for llama.cpp, "
               "or a compact fp16 .tinygpt", EXPORT, cmd_export),
}


def build_parser():
    common = argparse.ArgumentParser(add_help=False)
    add_flags(common, [flag_of("--debug", action="store_true", default=argparse.SUPPRESS,
                               help="show tracebacks on errors")])
    ap = Parser(prog="tinygpt", description="A WebGPU trainer for small GPT models.")
    add_flags(ap, [DEBUG, flag_of("--version", action="version", version=version(),
                                  help="the version of tinygpt and of wgpu-py")])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for name, (help_, flags, fn) in COMMANDS.items():
        p = sub.add_parser(name, parents=[common], help=help_)
        train_flags(p) if flags is None else add_flags(p, flags)
        p.set_defaults(fn=fn)
    return ap


def handled(name: str, fn, debug: bool, stopped: str, traceback_hint: str) -> int:
    """fn() under the one error rule of the CLI and the scripts: every error one line on stderr with
    an exit code, no traceback unless debug; a TinyGPTError carries its own code (an Interrupted
    run has said why already)."""
    set_wording(flag)
    try:
        code = fn() or 0
        sys.stdout.flush()          # here, where a reader that left is caught, not at the exit
        return code
    except BrokenPipeError:         # `tinygpt info | head`: the reader left; end quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())     # nothing more to flush at exit
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"{name}: {stopped}", file=sys.stderr)
        return EXIT_INTERRUPT
    except Exception as e:      # the last guard: one line, whatever it was
        if debug:
            raise
        if isinstance(e, TinyGPTError):
            if not isinstance(e, Interrupted):
                print(f"{name}: error: {e.worded(flag)}", file=sys.stderr)
            return e.exit_code
        if isinstance(e, OSError):
            text = os_error_text(e)
        else:
            lines = str(e).strip().splitlines()
            text = f"{lines[0] if lines else type(e).__name__} ({traceback_hint} shows the traceback)"
        print(f"{name}: error: {text}", file=sys.stderr)
        return EXIT_ERROR


def run_script(name: str, main) -> None:
    """A script's entry point under the CLI's rules (TINYGPT_DEBUG=1 shows the traceback)."""
    sys.exit(handled(name, main, bool(os.environ.get("TINYGPT_DEBUG")), "stopped", "TINYGPT_DEBUG=1"))


def with_config(argv: list, args) -> argparse.Namespace:
    """train and plan with --config: the file's settings as flags placed before the command
    line's own, so each is checked as its flag is, and the command line wins."""
    if getattr(args, "config", None) is None:
        return args
    at = argv.index(args.cmd) + 1
    table = read_config(args.config)
    for group in ONE_OF:
        if any(getattr(args, key, None) is not None for key in group):
            table = {k: v for k, v in table.items() if k not in group}
    settings = settings_argv(table, f"--config {args.config}")
    return build_parser().parse_args(argv[:at] + settings + argv[at:])


def version() -> str:
    import platform
    import wgpu
    return f"tinygpt {__version__} (wgpu-py {wgpu.__version__}, Python {platform.python_version()})"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def run():
        args = build_parser().parse_args(argv)       # --help too: its reader may leave early
        settled = with_config(argv, args)
        return settled.fn(settled)
    return handled("tinygpt", run, "--debug" in argv,
                   "stopped at once without saving; the last checkpoint on disk is kept", "--debug")
