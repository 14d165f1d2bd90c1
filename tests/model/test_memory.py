"""The memory budget against what the model really allocates, and `tinygpt plan` / `train`
refusing a run that does not fit before anything is allocated."""
import json

import pytest

from tinygpt.core.block import BLOCKS
from tinygpt.core.precision import PRECISIONS
from tinygpt.device.gpu import buffer_bytes
from tinygpt.model import budget, buffers
from tinygpt.model.layout import flat_part
from tinygpt.commands.cli import main
from tinygpt.core.config import preset
from tinygpt.model.spec import RunSpec, decoder_spec


def allocated(gpu, monkeypatch, build):
    """Bytes of every device buffer `build()` asks for (dispatch uniforms and dummies aside)."""
    from tinygpt.device.planner import make_plan
    make_plan(gpu)                    # the subgroup check, once per device, allocates its own
    for slot in range(8):
        gpu.dummy("w", slot)
    gpu.dummy("r")
    sizes = []
    real = gpu.buffer

    def counting(nbytes, label="", binding=True):
        sizes.append(buffer_bytes(nbytes))
        return real(nbytes, label, binding)
    monkeypatch.setattr(gpu, "buffer", counting)
    build()
    monkeypatch.setattr(gpu, "buffer", real)
    return sum(sizes)


@pytest.mark.kernel
@pytest.mark.parametrize("attention, accum, vocab, limit, width, precision", [
    ("online", 1, 256, None, 24, "fp32"), ("naive", 1, 301, None, 24, "fp32"), ("online", 3, 256, None, 24, "fp32"),
    ("naive", 2, 2000, 600_000, 24, "fp32"), ("online", 2, 50257, 13_000_000, 24, "fp32"),
    ("online", 2, 2000, 600_000, 128, "fp32"),     # the token table split, through the head's block scratch
    ("online", 2, 256, None, 24, "bf16"), ("naive", 1, 2000, 600_000, 128, "bf16"),
    ("online", 1, 50257, 13_000_000, 24, "bf16"), ("online", 2, 256, None, 24, "f16"),
    ("naive", 1, 2000, 600_000, 128, "f16"), ("online", 1, 50257, 13_000_000, 24, "f16"),
    ("online", 2, 256, None, 24, "fp32 recompute"), ("naive", 1, 2000, 600_000, 128, "bf16 recompute"),
    ("online", 1, 256, None, 24, "f16 recompute"), ("online", 1, 50257, 13_000_000, 24, "fp32 recompute"),
    # LoRA: the frozen base (and its copy) beside the adapters' flat buffers, the products saved
    ("online", 2, 256, None, 24, "fp32 lora"), ("naive", 1, 2000, 600_000, 128, "bf16 lora recompute"),
    ("online", 1, 256, None, 24, "f16 lora"), ("online", 1, 50257, 13_000_000, 24, "fp32 lora recompute"),
    # each optimizer's state and scratch (Muon's Newton-Schulz matrices), in every precision
    ("online", 2, 301, None, 24, "fp32 lion"), ("naive", 1, 2000, 600_000, 128, "bf16 muon"),
    ("online", 1, 256, None, 24, "f16 muon recompute"), ("online", 1, 50257, 13_000_000, 24, "fp32 muon"),
    # the blocks' parts (core.block): RoPE's table, QK-norm's and the embedding norm's saved inputs, the
    # ones, k and v of fewer heads, the gate, an untied head's table
    ("online", 2, 256, None, 24, "fp32 nanochat"), ("naive", 1, 2000, 600_000, 128, "bf16 llama lora"),
    ("online", 1, 256, None, 24, "f16 nanochat recompute"), ("fused_sv", 1, 301, None, 24, "fp32 llama muon"),
    # heads of 16 channels set apart from the width: q and the attention 32 or 48 wide
    ("naive", 1, 2000, 600_000, 128, "bf16 llama lora apart"), ("online", 2, 256, None, 24, "fp32 nanochat apart"),
    # the buffer limit forced to 2 MiB: the flat arrays (a LoRA run's base and its copy) in parts
    ("online", 2, 2000, 600_000, 128, "fp32 muon parts"), ("naive", 1, 2000, 600_000, 128, "bf16 lora parts")])
def test_budget_is_what_the_model_allocates(gpu, plan, monkeypatch, attention, accum, vocab, limit, width, precision):
    from tinygpt.core.lora import TARGETS, make_lora
    precision, *more = precision.split()
    recompute = "recompute" in more          # one set of block activations, shared by the layers
    parts = {**BLOCKS.get(next((b for b in more if b in BLOCKS), "gpt2")), **({"kv_heads": 1} if "llama" in more else {}),
             **({"head_dim": 16} if "apart" in more else {})}
    gated = "llama" in more
    lora = make_lora(8, targets=[t for t in TARGETS if gated or t != "gate"]) if "lora" in more else None
    from tinygpt.model.optimizers import make_settings
    opt = make_settings(next((o for o in ("lion", "muon") if o in more), "adamw"))
    if precision == "f16" and "shader-f16" not in gpu.features:
        pytest.skip(f"{gpu.name} has no shader-f16")
    from tinygpt.model.decode import Decoder
    from tinygpt.model.gpt import Model
    cfg = preset("tiny", layers=2, d_model=width, heads=2 if width == 128 else 3, ctx=40, vocab=vocab, **parts)
    if limit:     # logits and score matrices split into chunks
        monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
    if "parts" in more:
        monkeypatch.setitem(gpu.limits, "max-buffer-size", 2 << 20)
    limits = budget.device_limits(gpu)
    precision = PRECISIONS[precision]
    spec = RunSpec(cfg, attention, B=6, accum=accum, precision=precision, recompute=recompute, lora=lora, optimizer=opt)
    p = budget.memory_budget(spec, plan, limits, sample=0)      # the one value both take
    if precision.feature:    # the f16 numerics check's small, short-lived tensors, made once per device: not the model's
        Model(gpu, plan, spec)                                                    # nor the sampler's (its
        Decoder(gpu, plan, decoder_spec(cfg, attention, precision=precision), 50)   # decode kernels)
    got = allocated(gpu, monkeypatch, lambda: Model(gpu, plan, spec))
    if "parts" in more:
        from tinygpt.model.layout import Parts
        flat = Model(gpu, plan, spec).buf["base" if lora else "params"]
        assert isinstance(flat, Parts) and len(flat.tensors) > 1
    print(f"{attention} accum {accum} V {vocab} {precision.name}{' recompute' if recompute else ''}"
          f"{' lora' if lora else ''} {opt.name}: budget {p.total:,} bytes, model {got:,}")
    assert got == p.total
    if opt.name != "adamw":    # Lion keeps one moment where AdamW keeps two; Muon adds its scratch
        adam = budget.memory_budget(spec.with_(optimizer=None), plan, limits, sample=0)
        state, scratch = "optimizer state", buffers.OP
        assert (p.groups[state] * 2 == adam.groups[state]) if opt.name == "lion" else \
            (p.groups[state] == adam.groups[state] and p.groups[scratch] > adam.groups[scratch])
    if recompute:          # smaller than saving every layer's, by the saved activations of all but one
        full = budget.memory_budget(spec.with_(recompute=False), plan, limits, sample=0)
        assert p.total < full.total and p.groups[buffers.A] < full.groups[buffers.A]
    if lora:               # gradients and moments of the adapters alone
        full = budget.memory_budget(spec.with_(lora=None, optimizer=opt), plan, limits, sample=0)
        assert p.groups["gradients"] < full.groups["gradients"] and p.groups["optimizer state"] < full.groups["optimizer state"]
    want = budget.sampler_bytes(decoder_spec(cfg, attention, precision=precision), 50, plan, limits["max_binding"],
                                flat_part(limits["max_buffer"], limits["align"]))
    got = allocated(gpu, monkeypatch, lambda: Decoder(gpu, plan, decoder_spec(cfg, attention, precision=precision), 50))
    assert got == want


def test_plan_cli_json_and_text(capsys):
    assert main(["plan", "--preset", "small", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"params", "total_bytes", "largest_binding_bytes", "fits"} <= set(d)
    assert d["params"] == 366_432 and d["fits"] is True and d["total_bytes"] > 4 * 4 * 366_432
    assert main(["plan", "--preset", "small", "--tokenizer", "gpt2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["params"] == 366_432 - 256 * 96 + 50257 * 96 and d["bytes"]["logits"] >= 4 * 1024 * 50264
    assert main(["plan", "--preset", "gpt2", "--json"]) == 0        # GPT-2 small: its own tokenizer, split bindings
    d = json.loads(capsys.readouterr().out)
    assert d["params"] == 124_439_808 and d["largest_binding_bytes"] <= d["limits"]["max_binding"]
    assert not any("binding" in p for p in d["problems"])
    assert main(["plan", "--preset", "medium", "--grad-accum", "2"]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and "activations (saved)" in out and "largest binding" in out and "fits" in out


def test_plan_of_a_chat_file_counts_its_packed_batch(capsys, tmp_path):
    """A chat file's windows are packed (recipe.run_spec decides it, for `plan` as for `train`), so
    the plan counts the batch's two packed parts: each row's position in its record (B*T words) and
    the rows bucketed by position (T + 1 offsets and B*T rows)."""
    chat = tmp_path / "c.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    assert main(["plan", "--preset", "small", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["bytes"]["batch"]
    assert main(["plan", "--preset", "small", "--data", str(chat), "--json"]) == 0
    packed = json.loads(capsys.readouterr().out)["bytes"]["batch"]
    BT, T = 16 * 64, 64
    print(f"batch of the small preset: {plain:,} bytes, packed {packed:,}")
    assert packed >= plain + 4 * (BT + T + 1 + BT)


def test_plan_of_gpt2_with_lora_and_recompute_is_at_most_half(capsys):
    """GPT-2 small's shape: LoRA (rank 8 on q, k, v, o) with recompute plans at most half of full
    fine-tuning, at the preset's batch and at batch 8 (where the saved activations dominate)."""
    for batch in ([], ["--batch", "8"]):
        totals = []
        for more in ([], ["--lora", "8", "--recompute"]):
            rc = main(["plan", "--preset", "gpt2", *batch, *more, "--json"])
            d = json.loads(capsys.readouterr().out)
            assert rc == (0 if d["fits"] else 4)
            totals.append(d["total_bytes"])
            assert d["fits"] or batch, d["problems"]
        with capsys.disabled():
            print(f"gpt2 {' '.join(batch) or 'batch 1'}: full {totals[0]:,} bytes, LoRA 8 + recompute {totals[1]:,} "
                  f"({totals[1] / totals[0]:.3f})")
        assert 2 * totals[1] <= totals[0]


def test_a_run_that_does_not_fit_is_refused_before_allocating(gpu, tmp_path, capsys, monkeypatch):
    """batch x ctx over the CPU adapter's loop cap: the plan says which micro-batch fits."""
    if not gpu.is_cpu:
        pytest.skip("the loop cap is a CPU adapter's")
    args = ["--preset", "tiny", "--ctx", "512", "--batch", "256"]
    assert main(["plan", *args, "--json"]) == 4             # does not fit: its own exit code
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert d["fits"] is False and "loop trips" in d["problems"][0]
    refusal = captured.err.strip().splitlines()
    print(f"\nplan's refusal, {len(refusal[-1])} characters: {refusal[-1]}")
    assert len(refusal) == 1 and refusal[0].startswith("tinygpt: this run does not fit") and len(refusal[0]) < 300
    assert main(["plan", "--preset", "gpt2", "--batch", "64"]) == 4    # one problem a line, the first few
    out, err = capsys.readouterr()
    assert max(map(len, out.splitlines())) < 300 and len(err.strip().splitlines()) == 1 and len(err) < 300
    corpus = tmp_path / "c.txt"
    corpus.write_text("abc " * 50_000)
    monkeypatch.setattr("tinygpt.run.start.Model", lambda *a, **k: pytest.fail("the model was built"))
    rc = main(["train", *args, "--quiet", "--steps", "1", "--data", str(corpus), "--out", str(tmp_path / "m.tinygpt")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "does not fit" in err and "--batch 64 --grad-accum 4" in err, err


def test_parameters_over_one_buffer_are_refused_as_the_models_own(plan):
    """Flat arrays over the adapter's buffer cap are several buffers (Qwen3-0.6B's 2.4 GB of weights
    on lavapipe's 2 GiB), none over the cap; a parameter that is itself over one part cannot be
    split, and the refusal says that no option shrinks it, not to sample fewer tokens; a buffer of
    activations over the cap asks for a smaller batch or context."""
    from tinygpt.core.config import n_params
    cfg = preset("tiny")
    limits = {"max_buffer": 4 * n_params(cfg) - 1024, "max_binding": 1 << 27, "align": 256}
    p = budget.memory_budget(RunSpec(cfg, "online", B=1), plan, limits, sample=10)
    assert p.fits and max(n for what, n in p.buffers if what.startswith("params")) <= limits["max_buffer"]
    assert p.parts == 2 and "the largest in 2 buffers, no parameter across two" in budget.text(p)
    limits["max_buffer"] = 4 * 4096 * 2      # two 4,096-float grains: the token table [256, 48] is three
    p = budget.memory_budget(RunSpec(cfg, "online", B=1), plan, limits, sample=10)
    msg = budget.refusal(p, plan)
    print(f"\n{msg}")
    assert "parameter tok_emb [256, 48] needs a 49,152-byte buffer" in msg
    assert f"holds {limits['max_buffer'] // 4:,} float32 values at most" in msg and "sample" not in msg
    p = budget.memory_budget(RunSpec(cfg, "online", B=512), plan, dict(limits, max_buffer=1 << 22), sample=10)
    assert budget.refusal(p, plan).endswith("use a smaller {opt:batch} or {opt:ctx} (tinygpt plan shows every buffer)")


@pytest.mark.kernel
def test_sampling_logits_over_a_binding_are_refused_by_name(gpu, plan, monkeypatch):
    """The sampler binds every row of logits at once: past the limit, a LimitError naming them
    (with the cache: [N, V]; without it: N x ctx rows), not a wgpu failure."""
    from tinygpt.model.decode import Decoder
    from tinygpt.device.gpu import LimitError
    cfg = preset("tiny", layers=1, d_model=16, heads=2, ctx=70, vocab=50257)
    monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", 13_000_000)
    cached, full = plan.with_(decode="cache"), plan.with_(decode="full")
    assert Decoder(gpu, cached, decoder_spec(cfg, N=8), capacity=4)                  # 8 x 50264 floats fit
    with pytest.raises(LimitError, match="logits of 80 samples"):
        Decoder(gpu, cached, decoder_spec(cfg, N=80), capacity=4)                     # 16.1 MB
    with pytest.raises(LimitError, match="sample with the key/value cache"):
        Decoder(gpu, full, decoder_spec(cfg), capacity=4)                        # 70 rows: 14.1 MB, in chunks
