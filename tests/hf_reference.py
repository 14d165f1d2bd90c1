"""transformers' side of tests/test_hf_llama.py, run in a process of its own (torch beside lavapipe's
LLVM in one process crashes):

    python tests/hf_reference.py build OUT        random small Llama, Qwen2 and Qwen3 models, each
                                                  in OUT/<family> with a byte-level BPE tokenizer.json
                                                  and ref.npz: its logits, 20 greedy tokens, tokens
    python tests/hf_reference.py load DIR ...     each directory loaded as it is (AutoModelForCausalLM,
                                                  and peft's PeftModel over DIR/../hf where DIR has an
                                                  adapter_config.json): its logits and greedy text in
                                                  DIR/loaded.npz
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

IDS = np.array([[3, 50, 100, 7, 9, 33, 200, 17, 250, 1, 64, 128, 5, 77, 260, 2],
                [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 255, 254, 300, 301, 302, 303]])
PROMPT = IDS[0, :5]
TEXT = "To be, or not to be: that is the question"
# shapes small enough for lavapipe; each family with what sets it apart
COMMON = dict(hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, vocab_size=320,
              max_position_embeddings=64, rms_norm_eps=1e-5)
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,          # GQA, untied, Llama 3's base
              dict(num_key_value_heads=2, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,          # q/k/v biases, tied
              dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,          # QK-norm, multi-query, and
              dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)),  # q 64 wide in 32 (Qwen3-0.6B's)
}


def tokenizer(vocab: int):
    """A byte-level BPE trained here (no download), with an end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = (TEXT + ", whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune.\n") * 50
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def greedy(model, prompt, n=20):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0].numpy()


def build(out: Path):
    for name, (Config, Model, own) in FAMILIES.items():
        torch.manual_seed(len(name))
        model = Model(Config(**COMMON, **own)).eval()
        with torch.no_grad():
            for p in model.parameters():       # norms' gains and biases off their init, so every term counts
                p.add_(torch.randn_like(p) * 0.2)
        d = out / name
        model.save_pretrained(d, safe_serialization=True)
        tok = tokenizer(300)
        tok.save(str(d / "tokenizer.json"))
        c = json.loads((d / "config.json").read_text())
        if name == "qwen2":                    # the hub's spelling of RoPE's base (transformers 4's)
            c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
            c["rope_scaling"] = None
        c["eos_token_id"] = tok.token_to_id("<|endoftext|>")
        (d / "config.json").write_text(json.dumps(c))
        with torch.no_grad():
            logits = model(torch.tensor(IDS)).logits.numpy()
        np.savez(d / "ref.npz", logits=logits, ids=IDS, greedy=greedy(model, PROMPT),
                 text_ids=np.array(tok.encode(TEXT).ids))


def load(d: Path):
    if (d / "adapter_config.json").exists():
        import peft
        base = transformers.AutoModelForCausalLM.from_pretrained(d.parent / "hf")
        model = peft.PeftModel.from_pretrained(base, d).eval()
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        logits = model(torch.tensor(IDS)).logits.numpy()
    text = ""
    if (d / "tokenizer.json").exists():
        pipe = transformers.pipeline("text-generation", model=model, tokenizer=transformers.AutoTokenizer.from_pretrained(d))
        text = pipe(TEXT, max_new_tokens=20, min_new_tokens=20, do_sample=False)[0]["generated_text"]
    np.savez(d / "loaded.npz", logits=logits, text=np.array(text), architecture=np.array(type(model).__name__))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        for d in sys.argv[2:]:
            load(Path(d))
