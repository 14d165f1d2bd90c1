"""The .tinygpt file as TinyGPT's own readers see it: judged by the validator in tests/upstream.py,
written from upstream's published format, not from our writer, so a file that passes it is one
upstream's browser playground, python_ref/load_tinygpt.py and Mac app can read. The compact fp16
and int4 files are built byte by byte in upstream's layout, the same way."""
import json
import struct

import numpy as np
import pytest

from support import TINY, in_process as cli, one_line_error
from upstream import (fp16_state, header_of, is_num, stored_weights, upstream_file, upstream_problems,
                      with_config)
from tinygpt.files import checkpoint as ckpt
from tinygpt.core.config import Config
from tinygpt.core.init import init_params


def int4_state(cfg, params, block=64):
    """Upstream's int4: per block absmax/7 scales as f16, q = round(w/scale) in [-7, 7] stored as
    q + 8, all tensors' scales first, then the nibbles, partial blocks zero-padded, element i in
    the low nibble when i is even. Returns (state, the weights its reader must give back)."""
    scales, packed, back = [], [], []
    for w in stored_weights(cfg, params):
        nb = -(-w.size // block)
        padded = np.zeros(nb * block, np.float32)
        padded[:w.size] = w
        blocks = padded.reshape(nb, block)
        s = (np.abs(blocks).max(axis=1) / 7).astype(np.float16)
        s32 = s.astype(np.float32)
        q = np.where(s32[:, None] > 0, np.clip(np.round(blocks / np.where(s32 > 0, s32, 1)[:, None]), -7, 7), 0)
        nib = (q + 8).astype(np.uint8).reshape(-1)
        nib[w.size:] = 0
        packed.append(nib[0::2] | (nib[1::2] << 4))
        scales.append(s)
        back.append(((nib.astype(np.float32) - 8).reshape(nb, block) * s32[:, None]).reshape(-1)[:w.size])
    state = struct.pack("<i", 0) + b"".join(s.astype("<f2").tobytes() for s in scales) \
        + b"".join(p.tobytes() for p in packed)
    return state, back, sum(s.size for s in scales)


CFG = Config(layers=2, d_model=48, heads=3, ctx=16, batch=4, vocab=256)   # TINY's shape


# ---- what we write ---------------------------------------------------------------------------
def test_every_file_we_write_reads_as_upstreams(tmp_path, sentences):
    """train, resume and both exports: every header passes upstream's rules; the fp16 export holds
    the weights rounded to f16 and nothing else."""
    a = tmp_path / "a.tinygpt"
    rc, err = cli("train", *TINY, "--data", sentences, "--steps", 4, "--log-every", 2, "--eval-every", 4, "--out", a,
                  "--optimizer", "adamw")     # upstream's moments in the state (Lion's and Muon's files: test_optim)
    assert rc == 0, err
    raw = a.read_bytes()
    assert upstream_problems(raw) == []
    h = header_of(raw)
    assert h["finalLoss"]["step"] == 4 and is_num(h["finalLoss"]["train"]) and is_num(h["finalLoss"]["val"])
    assert h["bestVal"]["step"] == 4 and h["corpus"] == "c.txt" and h["config"]["maxSteps"] == 4
    rc, err = cli("train", "--resume", a, "--data", sentences, "--steps", 6, "--quiet", "--eval-every", 0)
    assert rc == 0, err
    assert upstream_problems(a.read_bytes()) == [] and header_of(a.read_bytes())["finalLoss"]["step"] == 6
    small = tmp_path / "a16.tinygpt"
    rc, err = cli("export", "--model", a, "--format", "tinygpt-fp16", small)
    assert rc == 0, err
    raw16 = small.read_bytes()
    assert upstream_problems(raw16) == [] and header_of(raw16)["weightDtype"] == "fp16"
    full, half = ckpt.load(a), ckpt.load(small)
    assert half.m is None and half.step == full.step == 6 and half.weight_dtype == "fp16"
    worst = 0.0
    for name in full.params:
        assert np.array_equal(half.params[name], full.params[name].astype(np.float16).astype(np.float32)), name
        worst = max(worst, float(np.abs(half.params[name] - full.params[name]).max()))
    print(f"fp16 export: {len(raw16):,} of {len(raw):,} bytes, max rounding {worst:.2e}")
    assert len(raw16) < len(raw) / 5


def test_an_imported_model_reads_as_upstreams(tmp_path):
    """import-hf's file too: a fresh checkpoint with zero moments, in upstream's layout."""
    from support import model
    from tinygpt.files.hf import export_hf
    export_hf(model(), tmp_path / "hf")
    rc, err = cli("import-hf", tmp_path / "hf", "--out", tmp_path / "m.tinygpt")
    assert rc == 0, err
    raw = (tmp_path / "m.tinygpt").read_bytes()
    assert upstream_problems(raw) == [] and header_of(raw)["finalLoss"] is None


def test_resuming_an_upstream_file_keeps_its_fields(tmp_path, sentences):
    """An fp32 file in upstream's layout, with the fields upstream writes: its weights load in
    their place, its corpus is not forgotten, and after our resume every field we do not use is
    still there while the ones we compute are upstream's types."""
    p = init_params(CFG)
    params = {k: (v + 0.01 * np.arange(v.size).reshape(v.shape) % 0.3).astype(np.float32) for k, v in p.items()}
    state = struct.pack("<i", 100) + b"".join(
        np.concatenate([w, np.full_like(w, 1e-3), np.full_like(w, 1e-6)]).astype("<f4").tobytes()
        for w in stored_weights(CFG, params))
    fields = {"includesOptimizerState": True, "weightDtype": "fp32", "corpus": "shakespeare",
              "lossHistory": [{"step": 100, "train": 2.5, "val": 2.6}],
              "finalLoss": {"step": 100, "train": 2.5, "val": 2.6}, "sample": "ROMEO: hello",
              "bestVal": {"loss": 2.4, "step": 90}, "project": "https://github.com/sarthak-fleet/tinygpt",
              "sparsityMasks": {}}
    f = tmp_path / "up.tinygpt"
    f.write_bytes(upstream_file(CFG, fields, state))
    ck = ckpt.load(f)
    assert ck.step == 100 and all(np.array_equal(ck.params[k], params[k]) for k in params)
    rc, err = cli("eval", "--model", f)
    one_line_error(rc, err, "'shakespeare'", "--data")
    rc, err = cli("train", "--resume", f, "--steps", 102, "--quiet", "--eval-every", 0)
    one_line_error(rc, err, "'shakespeare'", "--data")
    rc, err = cli("train", "--resume", f, "--data", sentences, "--steps", 102, "--quiet", "--eval-every", 0,
                  "--log-every", 1)
    assert rc == 0, err
    raw = f.read_bytes()
    assert upstream_problems(raw) == []
    h = header_of(raw)
    for k in ("sample", "project", "sparsityMasks"):
        assert h[k] == fields[k], k
    assert h["config"]["backend"] == "wasm" and h["config"]["maxSteps"] == 102
    assert h["bestVal"] == {"loss": 2.4, "step": 90}
    assert h["corpus"] == "shakespeare" and h["tinygptPy"]["data"].endswith("c.txt")    # the user's text kept
    rc, err = cli("train", "--resume", f, "--data", sentences, "--steps", 104, "--quiet", "--eval-every", 0)
    assert rc == 0 and header_of(f.read_bytes())["corpus"] == "shakespeare"             # and on every resume
    assert [p["step"] for p in h["lossHistory"]] == [100, 101, 102] and h["finalLoss"]["step"] == 102
    assert h["savedAt"] != "2026-05-01T10:00:00.000Z"


def test_a_version_1_file_holds_weights_and_moments(tmp_path, sentences):
    """Version 1 (no manifest, no includesOptimizerState, no stateByteLength): upstream's reader
    takes the fp32 state as weights and moments, and so do we (it was refused as "more state
    than its config needs"); a version-1 state of the weights alone reads as weights."""
    p = init_params(CFG)
    stored = list(stored_weights(CFG, p))
    for with_moments in (True, False):
        state = struct.pack("<i", 40) + b"".join(
            (np.concatenate([w, np.full_like(w, 2e-3), np.full_like(w, 3e-6)]) if with_moments else w)
            .astype("<f4").tobytes() for w in stored)
        header = {"version": 1, "savedAt": "2025-01-01T00:00:00.000Z", "corpus": "hello",
                  "config": {"layers": CFG.layers, "dModel": CFG.d_model, "ctx": CFG.ctx, "heads": CFG.heads,
                             "dMlp": CFG.d_mlp, "batchSize": CFG.batch, "learningRate": 3e-4, "gradClip": 1.0,
                             "seed": 7}}
        hb = json.dumps(header).encode()
        f = tmp_path / f"v1{with_moments}.tinygpt"
        f.write_bytes(b"TGPT" + struct.pack("<II", 1, len(hb)) + hb + state)
        ck = ckpt.load(f)
        assert ck.step == 40 and all(np.array_equal(ck.params[k], p[k]) for k in p)
        if with_moments:
            assert all(np.all(ck.m[k] == np.float32(2e-3)) and np.all(ck.v[k] == np.float32(3e-6)) for k in p)
        else:
            assert ck.m is None
    rc, err = cli("train", "--resume", tmp_path / "v1True.tinygpt", "--data", sentences, "--steps", 42, "--quiet",
                  "--eval-every", 0, "--sample-tokens", 0)
    assert rc == 0, err


# ---- what upstream writes --------------------------------------------------------------------
@pytest.fixture
def weights():
    rng = np.random.default_rng(5)
    return {k: rng.normal(0, 0.05, v.shape).astype(np.float32) for k, v in init_params(CFG).items()}


def test_fp16_and_int4_weights_only_files_load_with_their_weights(tmp_path, weights):
    f16 = tmp_path / "g.bin"
    f16.write_bytes(upstream_file(CFG, {"includesOptimizerState": False, "weightDtype": "fp16"},
                                  fp16_state(CFG, weights, step=250)))
    ck = ckpt.load(f16)
    assert ck.step == 250 and ck.m is None and ck.weight_dtype == "fp16"
    for name in weights:
        assert np.array_equal(ck.params[name], weights[name].astype(np.float16).astype(np.float32)), name
    for block in (64, 40):     # 40: blocks that straddle tensors' ends (48-element biases: partial blocks)
        state, back, nscales = int4_state(CFG, weights, block)
        hdr = {"includesOptimizerState": False, "weightDtype": "int4", "int4ScalesBytes": 2 * nscales,
               "int4PackedBytes": len(state) - 4 - 2 * nscales}
        if block != 64:
            hdr["int4BlockSize"] = block
        f4 = tmp_path / f"g{block}.int4.bin"
        f4.write_bytes(upstream_file(CFG, hdr, state))
        ck = ckpt.load(f4)
        worst = 0.0
        for (name, shape, _), want in zip(ckpt.param_shapes(CFG), back):
            got = ck.params[name].reshape(-1)
            assert np.array_equal(got, want), name
            worst = max(worst, float(np.abs(got - weights[name].reshape(-1)).max()))
        step = float(np.abs(np.concatenate([w.reshape(-1) for w in weights.values()])).max()) / 7
        print(f"int4 block {block}: max error {worst:.3e} against the weights (quantization step {step:.3e})")
        assert worst <= step / 2 * 1.01


def test_compact_files_are_sampled_evaluated_and_fine_tuned(tmp_path, weights, sentences):
    state, _, nscales = int4_state(CFG, weights)
    files = {"fp16": fp16_state(CFG, weights), "int4": state}
    for dtype, st in files.items():
        f = tmp_path / f"{dtype}.tinygpt"
        f.write_bytes(upstream_file(CFG, {"includesOptimizerState": False, "weightDtype": dtype}, st))
        rc, err = cli("info", "--model", f)
        assert rc == 0, err
        rc, err = cli("eval", "--model", f, "--data", sentences, "--max-windows", 8)
        assert rc == 0, err
        rc, err = cli("sample", "--model", f, "--tokens", 8, "--prompt", "It")
        assert rc == 0, err
        out = tmp_path / f"{dtype}-tuned.tinygpt"
        rc, err = cli("train", "--resume", f, "--data", sentences, "--steps", 2, "--out", out, "--quiet",
                      "--eval-every", 0)
        assert rc == 0, err
        tuned = ckpt.load(out)
        assert tuned.step == 2 and tuned.m is not None and tuned.extra["momentsFrom"] == 0
        assert upstream_problems(out.read_bytes()) == []
        assert "int4BlockSize" not in header_of(out.read_bytes())


def test_a_bf16_file_holds_the_weights_rounded_once_and_is_used_as_the_others(tmp_path, weights, sentences):
    """--dtype bf16's layout (this trainer's compact base; import-hf writes it): every weight the
    nearest bfloat16, ties to even, half the bytes of fp32, in a version 3 file even for GPT-2's
    block (a reader that takes an unknown weightDtype as fp32 must refuse it, as upstream's refuse
    version 3); info, eval, sample and a fine-tune (moments from zero) read it, and LoRA on it."""
    f = tmp_path / "b.tinygpt"
    ckpt.save(f, ckpt.Checkpoint(CFG, weights, step=0), "bf16")
    raw = f.read_bytes()
    assert struct.unpack("<I", raw[4:8])[0] == 3 and header_of(raw)["weightDtype"] == "bf16"
    ck = ckpt.load(f)
    assert ck.step == 0 and ck.m is None and ck.weight_dtype == "bf16"
    worst = 0.0
    for name, w in weights.items():
        bits = w.view(np.uint32)
        want = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
        assert np.array_equal(ck.params[name], want), name
        worst = max(worst, float((np.abs(ck.params[name] - w) / np.maximum(np.abs(w), 1e-30)).max()))
    print(f"bf16 file: {len(raw):,} bytes, the weights' largest relative rounding {worst:.2e} "
          f"(half an ulp, 2^-8 = {2 ** -8:.2e})")
    assert worst <= 2 ** -8
    tie = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, np.nan, -np.inf], np.float32)        # ties to even; nan; inf
    assert list(ckpt.to_bf16(tie)) == [0x3F80, 0x3F82, 0x7FC0, 0xFF80]
    for args in (("info", "--model", f), ("eval", "--model", f, "--data", sentences, "--max-windows", 8),
                 ("sample", "--model", f, "--tokens", 8, "--prompt", "It")):
        rc, err = cli(*args)
        assert rc == 0, err
    for more in ((), ("--lora", 4)):
        out = tmp_path / f"tuned{len(more)}.tinygpt"
        rc, err = cli("train", "--resume", f, "--data", sentences, "--steps", 2, "--out", out, "--quiet",
                      "--eval-every", 0, *more)
        assert rc == 0, err
        assert ckpt.load(out).step == 2


def test_weights_only_resume_starts_the_moments_bias_correction_afresh(tmp_path, weights, sentences):
    """Zero moments at step 250: AdamW's bias correction counts from the resume (momentsFrom),
    so the first update is lr-sized, not 3x it as 1 - beta^251 ~ 1 would make it."""
    f = tmp_path / "g.tinygpt"
    f.write_bytes(upstream_file(CFG, {"includesOptimizerState": False, "weightDtype": "fp16"},
                                fp16_state(CFG, weights, step=250)))
    out = tmp_path / "t.tinygpt"
    rc, err = cli("train", "--resume", f, "--data", sentences, "--steps", 251, "--out", out, "--quiet",
                  "--eval-every", 0, "--lr", "1e-3", "--schedule", "constant")
    assert rc == 0, err
    before, after = ckpt.load(f), ckpt.load(out)
    assert after.extra["momentsFrom"] == 250
    moved = max(float(np.abs(after.params[k] - before.params[k]).max()) for k in before.params
                if k.endswith("Wq"))
    print(f"largest change of a Wq in the first step after a weights-only resume: {moved:.3e} (lr 1e-3)")
    assert moved <= 1.001e-3 * 1.01


# ---- what we cannot compute is refused -------------------------------------------------------
@pytest.mark.parametrize("config, needle", [
    ({"slidingWindow": -8}, "config.slidingWindow is -8"),
    ({"slidingWindow": 2.5}, "config.slidingWindow"),
    ({"nExperts": 4, "moeTopK": 2}, "nExperts 4"),
    ({"useDifferentialAttention": True}, "useDifferentialAttention"),
    ({"vocabSize": 512, "tokenizerSource": "tokenizers/my-bpe"}, "'tokenizers/my-bpe'"),
    ({"layers": 1.5}, "config.layers"),
    ({"learningRate": "abc"}, "config.learningRate"),
    ({"activation": "geglu"}, "activation 'geglu'"),
    ({"activation": {"name": "gelu"}}, 'activation {"name": "gelu"}'),
])
def test_what_we_cannot_compute_is_refused_naming_the_field(tmp_path, weights, config, needle):
    cfg = Config(**{**CFG.__dict__, "vocab": config.get("vocabSize", 256)})
    p = init_params(cfg)
    f = tmp_path / "x.tinygpt"
    raw = upstream_file(cfg, {"includesOptimizerState": False, "weightDtype": "fp16"}, fp16_state(cfg, p))
    f.write_bytes(with_config(raw, **config))
    rc, err = cli("info", "--model", f)
    one_line_error(rc, err, needle)


def test_what_a_file_says_is_checked_against_what_it_holds(tmp_path, weights):
    raw = upstream_file(CFG, {"includesOptimizerState": False, "weightDtype": "fp16"}, fp16_state(CFG, weights))
    n = struct.unpack("<I", raw[8:12])[0]
    h, state = header_of(raw), raw[12 + n:]

    def write(header, st=state):
        hb = json.dumps(header).encode() if isinstance(header, dict) else header
        f = tmp_path / "x.tinygpt"
        f.write_bytes(b"TGPT" + struct.pack("<II", 2, len(hb)) + hb + st)
        return cli("info", "--model", f)

    one_line_error(*write(h, struct.pack("<i", -3) + state[4:]), "step -3")
    swapped = json.loads(json.dumps(h))
    swapped["manifest"][4], swapped["manifest"][5] = swapped["manifest"][5], swapped["manifest"][4]
    one_line_error(*write(swapped), "manifest entry 4")
    one_line_error(*write(dict(h, weightDtype="int8")), "'int8'")
    one_line_error(*write(dict(h, weightDtype="int4", int4BlockSize=63)), "int4BlockSize")
    one_line_error(*write(dict(h, weightDtype="fp16", includesOptimizerState=True)), "weights only")
    one_line_error(*write(b"[" * 100_000 + b"]" * 100_000), "too deeply")


def test_an_fp32_file_is_read_once_into_memory(tmp_path):
    """load reads an fp32 file's tensors one at a time into arrays of their own, not the whole state
    and then a copy of it (Qwen3-0.6B's plan peaked at twice its 7.2 GB file before): each array its
    own, writable; an fp16 file's the same values through its conversion."""
    cfg = Config(layers=1, d_model=16, heads=2, ctx=8).validate()
    params = init_params(cfg)
    rng = np.random.default_rng(0)
    m = {n: rng.normal(size=a.shape).astype(np.float32) for n, a in params.items()}
    v = {n: rng.random(size=a.shape).astype(np.float32) for n, a in params.items()}
    ckpt.save(tmp_path / "a.tinygpt", ckpt.Checkpoint(cfg, params, m, v, 3, extra={"tokenizer": "byte"}))
    back = ckpt.load(tmp_path / "a.tinygpt")
    arrays = [d[n] for d in (back.params, back.m, back.v) for n in params]
    assert all(a.flags.owndata and a.flags.writeable and a.dtype == np.float32 for a in arrays)
    back.params["h0.Wq"][...] = 7.0                  # one region: nothing else moves
    assert all(np.array_equal(back.params[n], params[n]) for n in params if n != "h0.Wq")
    assert all(np.array_equal(back.m[n], m[n]) and np.array_equal(back.v[n], v[n]) for n in params)
    light = ckpt.load(tmp_path / "a.tinygpt", moments=False)    # evaluation's, sampling's, a plan's: no moments
    assert light.m is None and light.v is None and light.step == 3
    assert all(np.array_equal(light.params[n], params[n]) for n in params)
    ckpt.save(tmp_path / "h.tinygpt", ckpt.Checkpoint(cfg, params, extra={"tokenizer": "byte"}), dtype="fp16")
    half = ckpt.load(tmp_path / "h.tinygpt").params
    assert all(a.dtype == np.float32 and np.abs(a - params[n]).max() <= 1e-3 for n, a in half.items())
    raw = (tmp_path / "a.tinygpt").read_bytes()
    (tmp_path / "short.tinygpt").write_bytes(raw[:-4])            # a state cut short: refused, not misread
    for moments in (True, False):
        with pytest.raises(ckpt.CheckpointError):
            ckpt.load(tmp_path / "short.tinygpt", moments=moments)
