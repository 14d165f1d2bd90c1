"""transformers' side of tests/files/test_hf_llama.py, run in a process of its own (torch beside lavapipe's
LLVM in one process crashes):

    python tests/files/hf_reference.py build OUT        random small Llama, Qwen2 and Qwen3 models, each
                                                  in OUT/<family> with a byte-level BPE tokenizer.json
                                                  and ref.npz: its logits, 20 greedy tokens, tokens
    python tests/files/hf_reference.py gguf OUT         the same three, each written with the gguf package's
                                                  writer as OUT/<family>-<type>.gguf (f32, f16, q8_0), a
                                                  chat template and its special tokens in the file, and
                                                  transformers' reading of each: its logits and greedy chat
                                                  replies in OUT/<family>-<type>.npz
    python tests/files/hf_reference.py chat OUT         a random small Qwen2 model in OUT/hf with a chat template
                                                  that marks the assistant's tokens ({% generation %}),
                                                  OUT/chat.jsonl of conversations, and transformers'
                                                  mean cross-entropy over their assistant tokens
                                                  (apply_chat_template's assistant mask) in OUT/chat.npz
    python tests/files/hf_reference.py chatloss OUT DIR  the same loss of DIR (a PEFT export over OUT/hf, or
                                                  a Hugging Face directory) in DIR/chatloss.npz, and the
                                                  DPO loss, reward accuracy and margin of OUT/pref.jsonl's
                                                  pairs with DIR's model against OUT/hf's (beta 0.1)
    python tests/files/hf_reference.py ggufread F ...   each GGUF file read by transformers' GGUF loader: its
                                                  logits, its tokenizer's ids of TEXT and its rendering of
                                                  a conversation, in F.npz
    python tests/files/hf_reference.py load DIR ...     each directory loaded as it is (AutoModelForCausalLM,
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
    # Llama 3.1's and 3.2's scaled RoPE (its wavelengths straddle the original context of 16), and linear's
    "llama3rope": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                   dict(num_key_value_heads=2, rope_parameters={
                       "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "linearrope": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                   dict(num_key_value_heads=4, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                                "factor": 2.0})),
    # Mistral: Llama's block, each query attending to its last sliding_window positions (6 of the 16)
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(num_key_value_heads=2, sliding_window=6, tie_word_embeddings=False)),
}


def tokenizer(vocab: int, chat: bool = False):
    """A byte-level BPE trained here (no download), with an end-of-text token; chat: a chat model's,
    with ChatML's turn tokens too (and trained on a shorter line, as those files always were)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    line = "the slings and arrows" if chat else "the slings and arrows of outrageous fortune"
    text = (TEXT + f", whether 'tis nobler in the mind to suffer {line}.\n") * 50
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if chat else ["<|endoftext|>"]
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
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


# a chat template in ChatML with a system turn by default, as SmolLM2's (a loop, a condition, a default)
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a test.<|im_end|>\n' }}{% endif %}"
            "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CONVERSATIONS = [
    [{"role": "user", "content": "To be?"}],
    [{"role": "system", "content": "Answer in verse."}, {"role": "user", "content": "Or not to be?"}],
    [{"role": "user", "content": "To be?"}, {"role": "assistant", "content": "that is"},
     {"role": "user", "content": "the question"}],
]
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
GGUF_TYPES = ("f32", "f16", "q8_0")
_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def gguf_name(name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    return f"blk.{parts[2]}.{_GGUF_NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"


def write_gguf(path: Path, arch: str, cfg, state: dict, tok, kind: str):
    """A model as llama.cpp's converter writes it: its fields, the tokenizer's vocabulary and merges,
    the template; a Llama's q and k with each head's rotary halves interleaved; 2-D weights in `kind`."""
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_vocab_size(cfg.vocab_size)
    vocab = tok.get_vocab()
    tokens = [None] * cfg.vocab_size
    for t, i in vocab.items():
        tokens[i] = t
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    types = [3 if t in special else 1 for t in tokens]
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    merges = json.loads(tok.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_chat_template(TEMPLATE)
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[kind]
    for name, t in state.items():
        a = t.detach().numpy().astype(np.float32)
        if arch == "llama" and (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
            n = heads if "q_proj" in name else kv
            a = a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        if a.ndim == 2 and kind != "f32":
            # rows not a whole number of Q8_0's 32-value blocks stay in f16, as llama.cpp's converter keeps them
            t_q = qtype if a.shape[-1] % 32 == 0 else gguf.GGMLQuantizationType.F16
            q = gguf.quants.quantize(a, t_q)
            w.add_tensor(gguf_name(name), q, raw_shape=q.shape, raw_dtype=t_q)
        else:
            w.add_tensor(gguf_name(name), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_build(out: Path):
    """Each family as GGUF files, and transformers' reading of each."""
    for name, (Config, Model, own) in FAMILIES.items():
        if name not in GGUF_ARCH:
            continue
        torch.manual_seed(len(name))
        if name == "qwen3":     # transformers' GGUF reader takes Qwen3's head dim as 128 whatever the file says
            own = dict(own, head_dim=128)
        cfg = Config(**dict(COMMON, max_position_embeddings=256), **own)     # room for a conversation
        model = Model(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.2)
        tok = tokenizer(300, chat=True)
        state = {k: v for k, v in model.state_dict().items() if "rotary" not in k}
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        for kind in GGUF_TYPES:
            f = out / f"{name}-{kind}.gguf"
            write_gguf(f, GGUF_ARCH[name], cfg, state, tok, kind)
            read = transformers.AutoModelForCausalLM.from_pretrained(out, gguf_file=f.name, dtype=torch.float32).eval()
            rtok = transformers.AutoTokenizer.from_pretrained(out, gguf_file=f.name)
            replies, prompts = [], []
            for conv in CONVERSATIONS:
                ids = rtok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if not isinstance(ids, list) else ids
                prompts.append(np.array(ids))
                with torch.no_grad():
                    got = read.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                        eos_token_id=rtok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=0)
                replies.append(rtok.decode(got[0, len(ids):], skip_special_tokens=True))
            with torch.no_grad():
                logits = read(torch.tensor(IDS)).logits.numpy()
                last = read(torch.tensor([prompts[0]])).logits[0, -1].numpy()
            np.savez(out / f"{name}-{kind}.npz", logits=logits, last=last, replies=np.array(replies),
                     prompt0=prompts[0], rendered=np.array(rtok.apply_chat_template(CONVERSATIONS[1], tokenize=False,
                                                                               add_generation_prompt=True)))


# ChatML whose assistant turns are marked for transformers' assistant mask: the content and the
# <|im_end|> that ends it, not the header, not the newline after
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
                 "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
                 "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHAT_RECORDS = [
    {"messages": [{"role": "system", "content": "Answer in verse."}, {"role": "user", "content": "To be?"},
                  {"role": "assistant", "content": "or not to be, that is the question"}]},
    {"prompt": "Whether 'tis nobler", "completion": "in the mind to suffer"},
    {"prompt": [{"role": "user", "content": "the slings"}],
     "completion": [{"role": "assistant", "content": "and arrows of outrageous fortune"}]},
    {"messages": [{"role": "user", "content": "To be?"}, {"role": "assistant", "content": "that is"},
                  {"role": "user", "content": "the question?"}, {"role": "assistant", "content": "whether 'tis"}]},
    {"messages": [{"role": "user", "content": "nobler in the mind"}, {"role": "assistant", "content": "to suffer."}]},
]


PREF_RECORDS = [
    {"prompt": "To be?", "chosen": "that is the question", "rejected": "whether 'tis nobler"},
    {"prompt": [{"role": "user", "content": "the slings"}], "chosen": [{"role": "assistant", "content": "and arrows"}],
     "rejected": [{"role": "assistant", "content": "of outrageous fortune, or to take arms"}]},
    {"prompt": "in the mind", "chosen": "to suffer", "rejected": "to be"},
    {"prompt": "Or not to be?", "chosen": "that is", "rejected": "the slings and arrows"},
    {"prompt": "nobler", "chosen": "in the mind to suffer", "rejected": "or not"},
    {"prompt": "whether", "chosen": "'tis nobler", "rejected": "to be, or not to be"},
]


def completion_logprobs(model, tok, records):
    """Each pair's (chosen, rejected) log-probability of its completion's assistant tokens (the
    template's generation marks), windows 2i and 2i+1."""
    out = []
    for r in records:
        for side in ("chosen", "rejected"):
            msgs = _turns(r["prompt"], "user") + _turns(r[side], "assistant")
            enc = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            ids, mask = torch.tensor([enc["input_ids"]]), torch.tensor(enc["assistant_masks"], dtype=torch.bool)
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0].double(), -1)
            out.append(float(logp[:-1].gather(1, ids[0, 1:, None])[:, 0][mask[1:]].sum()))
    return np.array(out)


def _turns(value, role):
    return [{"role": role, "content": value}] if isinstance(value, str) else value


def chat_loss(model, tok, records):
    """(mean cross-entropy over the assistant tokens of every record, their count): the mask is
    apply_chat_template's, from the template's generation marks."""
    total, count = 0.0, 0
    for r in records:
        msgs = r["messages"] if "messages" in r else _turns(r["prompt"], "user") + _turns(r["completion"], "assistant")
        enc = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = torch.tensor([enc["input_ids"]]), torch.tensor(enc["assistant_masks"], dtype=torch.bool)
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)
        nll = -logp[:-1].gather(1, ids[0, 1:, None])[:, 0]
        total += float(nll[mask[1:]].sum())
        count += int(mask[1:].sum())
    return total / count, count


def chat_build(out: Path):
    torch.manual_seed(7)
    Config, Model, own = FAMILIES["qwen2"]
    model = Model(Config(**dict(COMMON, max_position_embeddings=128), **own)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    d = out / "hf"
    model.save_pretrained(d, safe_serialization=True)
    tok = tokenizer(300, chat=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>",
        "bos_token": None, "pad_token": "<|endoftext|>"}))
    c = json.loads((d / "config.json").read_text())
    c["eos_token_id"] = tok.token_to_id("<|im_end|>")
    (d / "config.json").write_text(json.dumps(c))
    with open(out / "chat.jsonl", "w") as f:
        for r in CHAT_RECORDS:
            f.write(json.dumps(r) + "\n")
    with open(out / "pref.jsonl", "w") as f:
        for r in PREF_RECORDS:
            f.write(json.dumps(r) + "\n")
    loss, count = chat_loss(model, transformers.AutoTokenizer.from_pretrained(d), CHAT_RECORDS)
    np.savez(out / "chat.npz", loss=loss, count=count)


def chat_loss_of(out: Path, d: Path):
    if (d / "adapter_config.json").exists():
        import peft
        model = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(out / "hf"), d)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(d)
    tok = transformers.AutoTokenizer.from_pretrained(out / "hf")
    loss, count = chat_loss(model.eval(), tok, CHAT_RECORDS)
    policy = completion_logprobs(model, tok, PREF_RECORDS)
    base = completion_logprobs(transformers.AutoModelForCausalLM.from_pretrained(out / "hf").eval(), tok, PREF_RECORDS)
    margin = 0.1 * ((policy[0::2] - base[0::2]) - (policy[1::2] - base[1::2]))
    np.savez(d / "chatloss.npz", loss=loss, count=count, dpo=np.mean(np.logaddexp(0.0, -margin)),
             accuracy=np.mean(margin > 0), margin=np.mean(margin))


def gguf_read(f: Path):
    model = transformers.AutoModelForCausalLM.from_pretrained(f.parent, gguf_file=f.name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(f.parent, gguf_file=f.name)
    with torch.no_grad():
        logits = model(torch.tensor(IDS)).logits.numpy()
    rendered = tok.apply_chat_template(CONVERSATIONS[1], tokenize=False, add_generation_prompt=True) \
        if tok.chat_template else ""
    np.savez(f.with_suffix(".npz"), logits=logits, text_ids=np.array(tok.encode(TEXT, add_special_tokens=False)),
             rendered=np.array(rendered), architecture=np.array(type(model).__name__))


if __name__ == "__main__":
    if sys.argv[1] == "ggufread":
        for f in sys.argv[2:]:
            gguf_read(Path(f))
    elif sys.argv[1] == "chat":
        chat_build(Path(sys.argv[2]))
    elif sys.argv[1] == "chatloss":
        chat_loss_of(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    elif sys.argv[1] == "gguf":
        gguf_build(Path(sys.argv[2]))
    else:
        for d in sys.argv[2:]:
            load(Path(d))
