"""`tinygpt export`: a checkpoint in the formats other tools read."""
from __future__ import annotations

from pathlib import Path

from ..files import lora_files
from ..files import checkpoint as ckpt
from ..core.errors import TinyGPTError, UsageError
from ..files.hf import export_hf
from ..files.gguf_write import export_gguf, is_our_gguf
from ..run.options import ExportOptions
from ..files.outputs import Outputs, is_our_json, is_our_safetensors


def is_our_peft_config(path) -> bool:
    """A PEFT adapter_config.json is ours to replace where the adapters beside it are (PEFT's
    config takes no field of ours)."""
    return is_our_safetensors(Path(path).with_name("adapter_model.safetensors"))


def export(o: ExportOptions) -> None:
    """`tinygpt export`: a checkpoint as safetensors, a Hugging Face directory, a GGUF file, a PEFT
    adapter directory (a LoRA run's), or a .tinygpt file (float32, or upstream's fp16); the outputs
    claimed before anything is read, a directory the export made removed if it fails."""
    model, fmt, out, merge = o.model, o.format, o.out, o.merge
    what = f"{{opt:model}} {model}"
    if merge and fmt == "peft":
        raise UsageError("{opt:merge} folds the adapters into the weights; {opt:format} peft writes the adapters "
                         "alone: give one of them")
    outs = Outputs(o.force, {"model": model})
    d, made = Path(out), not Path(out).exists()     # a directory's claim makes it; a failed export removes it
    one_file = {"safetensors": ("safetensors file", is_our_safetensors), "gguf": ("GGUF file", is_our_gguf),
                "tinygpt": ("checkpoint", ckpt.is_tinygpt), "tinygpt-fp16": ("checkpoint", ckpt.is_tinygpt)}
    if fmt in one_file:
        outs.claim(out, "out", *one_file[fmt])
    else:
        if d.exists() and not d.is_dir():
            raise UsageError(f"{d} exists and is not a directory; {{opt:format}} {fmt} writes a directory: "
                             "choose another name")
        ours_beside = lambda p: is_our_json(Path(p).with_name("tokenizer_config.json"))
        formats = {"hf": [("config.json", "Hugging Face config", is_our_json),
                        ("model.safetensors", "safetensors file", is_our_safetensors),
                        ("tokenizer_config.json", "tokenizer config", is_our_json),
                        ("generation_config.json", "generation config", ours_beside),
                        ("tokenizer.json", "tokenizer", ours_beside), ("vocab.json", "GPT-2 vocabulary", ours_beside),
                        ("merges.txt", "GPT-2 merges", ours_beside)],
                 "peft": [("adapter_config.json", "PEFT adapter config", is_our_peft_config),
                          ("adapter_model.safetensors", "safetensors file", is_our_safetensors)]}
        # every file either export writes: those this one does not write are an earlier export's,
        # removed once this one is whole (a stale adapter_config.json makes transformers load PEFT
        # adapters; GPT-2's vocab.json beside a byte tokenizer.json, another tokenizer)
        claimed = [name for rows in formats.values() for name, label, ours in rows
                   if outs.claim(d / name, "out", label, ours)]
    try:
        ck = ckpt.load(model, what)
        held = lora_files.read(ck, what)
        if held is not None and fmt != "peft":
            if not merge:
                raise UsageError(f"{model} holds LoRA adapters: write them with {{opt:format}} peft, or fold "
                                 "them into the weights with {opt:merge}")
            ck = ckpt.Checkpoint(ck.cfg, lora_files.model_params(ck, what), None, None, ck.step, ck.loss_history,
                                 {k: v for k, v in ck.extra.items() if k != "lora"}, ck.header)
        elif merge and held is None:
            raise UsageError(f"{model} holds no LoRA adapters to merge; drop {{opt:merge}}")
        if fmt == "safetensors":
            ckpt.export_safetensors(ck, out)
        elif fmt == "tinygpt-fp16":      # upstream's compact form: fp16 weights, no optimizer state
            ckpt.save(out, ck, "fp16")
        elif fmt == "tinygpt":           # float32 with (zero, for a merged model) moments
            ckpt.save(out, ck)
        elif fmt == "gguf":
            export_gguf(ck, out, o.gguf_type, what, o.tokenizer_file)
        elif fmt == "peft":
            _remove_stale(d, claimed, lora_files.export_peft(ck, out, what))
        else:
            _remove_stale(d, claimed, export_hf(ck, out, what, o.tokenizer_file))
    except (OSError, TinyGPTError):
        if made and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
        raise


def _remove_stale(d: Path, claimed: list, written) -> None:
    """The claimed files of an earlier export (ours: the claim checked) that this one did not write."""
    for name in claimed:
        if name not in written and (d / name).is_file():
            (d / name).unlink()
