"""Sampling from the key/value cache: decode.wgsl's kernels against their twins at odd shapes,
sampling on the device against the NumPy twin (greedy ties, top-k, top-p, V not a multiple of
the workgroup, the GPT-2 vocabulary), and whole continuations: cached = full window = float64
reference, past several window restarts."""
import numpy as np
import pytest

from conftest import check
from tinygpt.device import kernels as K
from tinygpt.device.kernels import Kernels
from tinygpt.device.plan import PORTABLE
from tinygpt.reference import kernels as R
from tinygpt.core.config import preset
from tinygpt.model.decode import Decoder, window_start
from tinygpt.reference import gpt as RG
from tinygpt.core.init import init_params
from tinygpt.model.spec import decoder_spec

pytestmark = pytest.mark.kernel


def uniform(gpu, **kw):
    u = gpu.uniform(K.DECODE_UNIFORM_BYTES)
    gpu.queue.write_buffer(u, 0, K.decode_uniform(**kw))
    return u


# KV: the caches' key/value heads (grouped-query attention's caches hold those alone: 2 of 6 heads of
# 5 channels, and one of 8 heads, multi-query)
@pytest.mark.parametrize("N, T, C, H, KV, pos", [(1, 1, 4, 1, 1, 0), (3, 13, 20, 4, 4, 7), (2, 13, 20, 4, 4, 12),
                                                  (2, 70, 96, 3, 3, 69), (2, 13, 30, 6, 2, 9), (3, 11, 24, 8, 1, 10)])
def test_decode_kernels_match_their_twins(gpu, kn, rng, N, T, C, H, KV, pos):
    """attn_decode4 at head dims 4 and 32 (a vec4 at a time), attn_decode at 5 and 3."""
    V, W = 37, C // H * KV
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    tok, pos_emb, k, v, q = f(V, C), f(T, C), f(N, W), f(N, W), f(N, C)
    kc0, vc0 = f(N, T, W), f(N, T, W)
    ids = rng.integers(0, V, N).astype(np.uint32)
    u = uniform(gpu, N=N, T=T, C=C, H=H, pos=pos, step=0, V=V, VP=V, KV=KV)
    up = gpu.upload
    t_ids = gpu.tensor((N,), "u32", data=ids)
    x = gpu.tensor((N, C))
    kc, vc, out, scratch = up(kc0), up(vc0), gpu.tensor((N, C)), gpu.tensor((N, H, T))
    gpu.run([kn.decoding.embed_decode(t_ids, up(tok), up(pos_emb), x, N, C, u),
             kn.decoding.kv_append(up(k), up(v), kc, vc, N, W, u),
             kn.decoding.attn_decode(up(q), kc, vc, out, scratch, N, H, u)])
    want_kc, want_vc = R.kv_append(k, v, kc0, vc0, pos)
    check(f"embed_decode N={N} C={C}", gpu.read(x), R.embed_decode(ids, tok, pos_emb, pos), atol=0)
    check("kv_append k", gpu.read(kc), want_kc, atol=0)
    check("kv_append v", gpu.read(vc), want_vc, atol=0)
    want = R.attn_decode(q.astype(np.float64), want_kc.astype(np.float64), want_vc.astype(np.float64), pos, H)
    check(f"attn_decode{'4' * (C // H % 4 == 0)} T={T} hd={C // H} H={H} KV={KV} pos={pos}", gpu.read(out), want,
          atol=2e-6, rtol=1e-5)


def test_embed_decode_bound_a_chunk_of_rows_at_a_time(gpu, kn, rng):
    """Rows v0 .. v0+vn-1 of the table bound: only the sequences holding those tokens are written."""
    N, C, T, V, v0, vn = 9, 20, 5, 300, 128, 128
    tok, pos_emb = rng.standard_normal((V, C)).astype(np.float32), rng.standard_normal((T, C)).astype(np.float32)
    ids = np.array([0, 127, 128, 200, 255, 256, 299, 130, 5], np.uint32)
    prev = rng.standard_normal((N, C)).astype(np.float32)
    u = uniform(gpu, N=N, T=T, C=C, H=1, pos=3, step=0, V=V, VP=V, v0=v0, vn=vn)
    x = gpu.upload(prev)
    gpu.run([kn.decoding.embed_decode(gpu.tensor((N,), "u32", data=ids), gpu.upload(tok[v0:v0 + vn]), gpu.upload(pos_emb),
                            x, N, C, u)])
    want = R.embed_decode(ids, tok[v0:v0 + vn], pos_emb, 3, v0, out=prev)
    assert 0 < ((ids >= v0) & (ids < v0 + vn)).sum() < N
    check(f"embed_decode rows {v0}..{v0 + vn - 1}", gpu.read(x), want, atol=0)


def run_sampler(gpu, logits, temperature, top_k, top_p, seed, step):
    N, V = logits.shape
    u = uniform(gpu, N=N, T=1, C=4, H=1, pos=0, step=step, V=V, VP=V, top_k=top_k, seed=seed,
                temperature=temperature, top_p=top_p)
    ids = gpu.tensor((N + N * (step + 1),), "u32")
    gpu.run([Kernels(gpu, PORTABLE).decoding.sample_tokens(gpu.upload(logits), ids, N, u)])
    got = gpu.read(ids)
    assert np.array_equal(got[:N], got[N + step * N:])            # the next tokens, and the history row
    return got[:N]


def near_boundary(logits, temperature, top_k, top_p, seed, step, eps=1e-5):
    """Rows whose draw lands within eps (relative) of a bucket edge, or whose top-k / top-p cut
    falls between nearly equal logits: float32 on the device may go either way there."""
    near = []
    for n, row in enumerate(logits.astype(np.float64)):
        z = row / temperature
        e = np.exp(z - z.max())
        keep = np.ones(len(z), bool)
        zs = np.sort(z)[::-1]
        if top_k and top_k < len(z):
            keep = z >= zs[top_k - 1]
            if zs[top_k - 1] - zs[top_k] < eps:
                near.append(n)
                continue
        cum = np.cumsum(np.where(keep, e, 0.0))
        goal = R.draw(seed, n, step) * cum[-1]
        near_edge = np.min(np.abs(cum - goal)) < eps * cum[-1]
        if top_p < 1:
            mass = np.cumsum(np.exp(np.sort(z[keep])[::-1] - z.max()))
            near_edge |= np.min(np.abs(mass - top_p * mass[-1])) < eps * mass[-1]
        if near_edge:
            near.append(n)
    return near


@pytest.mark.parametrize("V, temperature, top_k, top_p", [(300, 1.0, 0, 1.0), (300, 0.7, 20, 1.0),
                                                            (257, 1.3, 0, 0.8), (300, 0.9, 40, 0.9),
                                                            (5, 1.0, 3, 0.5), (50257, 0.8, 0, 0.95)])
def test_sample_tokens_matches_its_twin(gpu, V, temperature, top_k, top_p):
    r = np.random.default_rng(V + top_k)
    N = 4 if V > 1000 else 64
    # a large vocabulary with spread-out logits puts ~1/V of the mass on each token, below float32's
    # summation error; peaked logits, as a trained model gives, keep the buckets wide
    logits = (r.standard_normal((N, V)) * (2 if V < 1000 else 5)).astype(np.float32)
    seen, skipped = set(), 0
    for seed, step in ((0, 0), (1337, 5), (2 ** 40 + 3, 99)):
        got = run_sampler(gpu, logits, temperature, top_k, top_p, seed, step)
        want = R.sample_tokens(logits, temperature, top_k, top_p, seed, step)
        near = near_boundary(logits, temperature, top_k, top_p, seed, step)
        ok = np.ones(N, bool)
        ok[near] = False
        skipped += len(near)
        assert np.array_equal(got[ok], want[ok]), np.flatnonzero((got != want) & ok)
        seen |= set(got.tolist())
    print(f"sample_tokens V={V} T={temperature} k={top_k} p={top_p}: {3 * N - skipped} draws equal, "
          f"{skipped} near an edge, {len(seen)} distinct tokens")
    assert skipped <= N // 4 + 1
    if top_k:
        top = np.argsort(-logits, 1)[:, :top_k]
        assert all(t in set(top[n]) for n, t in enumerate(got))


def test_greedy_is_the_argmax_with_the_lowest_index_on_ties(gpu):
    logits = np.zeros((3, 600), np.float32)
    logits[0, [7, 300, 599]] = 5.0               # ties across lanes: the lowest index
    logits[1, 599] = 1.0
    logits[2] = -1.0                              # all equal: index 0
    assert run_sampler(gpu, logits, 0.0, 0, 1.0, 0, 0).tolist() == [7, 599, 0]


def decoding(plan, cache: bool):
    """The plan with its decode family set: from the key/value cache, or the whole window."""
    return plan.with_(decode="cache" if cache else "full")


@pytest.mark.parametrize("half", ["bf16", "f16"])
@pytest.mark.parametrize("N, T, C, H, KV, pos", [(1, 1, 4, 1, 1, 0), (3, 13, 20, 4, 4, 7), (2, 70, 96, 3, 3, 69),
                                                  (2, 9, 24, 8, 8, 5), (2, 13, 40, 8, 2, 9), (2, 9, 24, 8, 2, 8)])
def test_half_decode_kernels_match_their_twins(gpu, kn, rng, N, T, C, H, KV, pos, half):
    """A bf16 or f16 model's cache: kv_append copies the step's k, v words bit for bit, and
    attn_decode with the type's section (head dims 4, 5 and 3; grouped caches of 2 key/value heads)
    and attn_decode4 with it (head dim 32: 8 values a load) read q and the caches as stored,
    against the float64 attention of the same 16-bit values."""
    if half == "f16" and "shader-f16" not in gpu.features:   # the kernels need no f16 type, but no
        pytest.skip(f"{gpu.name} has no shader-f16, so no f16 model")   # f16 model runs without it
    cast = R.cast_bf16 if half == "bf16" else R.cast_f16
    f = lambda *s: cast(rng.standard_normal(s).astype(np.float32)).reshape(*s[:-1], s[-1] // 2)
    W = C // H * KV
    k, v, q, kc0, vc0 = f(N, W), f(N, W), f(N, C), f(N, T, W), f(N, T, W)
    u = uniform(gpu, N=N, T=T, C=C, H=H, pos=pos, step=0, V=1, VP=1, KV=KV)
    up = lambda x: gpu.tensor(x.shape, half, data=x)
    kc, vc, out, scratch = up(kc0), up(vc0), gpu.tensor((N, C)), gpu.tensor((N, H, T))
    gpu.run([kn.decoding.kv_append(up(k), up(v), kc, vc, N, W, u),
             kn.decoding.attn_decode(up(q), kc, vc, out, scratch, N, H, u)])
    want_kc, want_vc = R.kv_append(k, v, kc0, vc0, pos)
    assert np.array_equal(gpu.read(kc), want_kc) and np.array_equal(gpu.read(vc), want_vc), "kv_append"
    want = R.stored_attn_decode(q, want_kc, want_vc, pos, H, half)
    check(f"attn_decode{'4' * (C // H % 8 == 0)} {half} T={T} hd={C // H} H={H} KV={KV} pos={pos}", gpu.read(out), want,
          atol=2e-6, rtol=1e-5)


def spread(cfg, seed=0, scale=0.3):
    p = init_params(cfg)
    r = np.random.default_rng(seed)
    return {k: (v + r.standard_normal(v.shape) * scale).astype(np.float32) for k, v in p.items()}


def reference_greedy(params, cfg, prompt, n):
    """float64, with the window policy; also the smallest top-2 margin of the logits seen."""
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    ids, s, margins = list(prompt), 0, []
    for _ in range(n):
        s = window_start(s, len(ids), cfg.ctx)
        z = RG.forward(p64, cfg, np.array([ids[s:]]))[0, -1]
        top2 = np.sort(z)[-2:]
        margins.append(top2[1] - top2[0])
        ids.append(int(np.argmax(z)))
    return ids, np.array(margins)


def check_greedy(gpu, plan, cfg, attention, prompt, n):
    """n greedy tokens of two sequences from the cache, by the whole window per token, and by the
    float64 reference: alike (a near-tie of the reference's logits, below 1e-4, skips)."""
    params = spread(cfg)
    got = {}
    for cache in (True, False):
        d = Decoder(gpu, decoding(plan, cache), decoder_spec(cfg, attention, N=2), capacity=n)
        d.set_params(params)
        got[cache] = d.generate(prompt, n)
    want, margins = reference_greedy(params, cfg, prompt, n)
    assert got[True] == got[False] and got[True][0] == got[True][1]
    mismatch = next((i for i, (a, b) in enumerate(zip(got[True][0], want)) if a != b), None)
    if mismatch is not None:   # only a near-tie may differ: detected and reported, not ignored
        at = margins[mismatch - len(prompt)]
        assert at < 1e-4, f"token {mismatch} differs at margin {at}"
        pytest.skip(f"a near-tie at token {mismatch} (margin {at:.2e})")
    print(f"greedy: {n} tokens equal; smallest top-2 margin {margins.min():.3e}")


@pytest.mark.parametrize("attention, parts", [("online", {}), ("naive", {}),
                                              ("online", dict(norm="rmsnorm_free", position="rope", activation="relu2",
                                                              bias="none", tied=False, qk_norm="free",
                                                              kv_heads=1, softcap=3.0, embed_norm=True)),
                                              ("online", dict(heads=4, head_dim=8, kv_heads=2, position="rope",
                                                              qk_norm="weighted", norm="rmsnorm"))])
def test_greedy_cached_equals_full_window_and_reference(gpu, plan, attention, parts):
    """230 tokens with ctx 16: the window restarts 26 times, 200+ tokens past its first end. And a
    rotary model's (with RMSNorm and ReLU²), whose step turns q and k at the decoded position; and
    one whose 4 heads of 8 make q 32 wide in a width of 24 (the cache's kernels read their own uniform)."""
    check_greedy(gpu, plan, preset("tiny", layers=2, d_model=24, ctx=16, **{"heads": 3, **parts}), attention, [5, 17, 99],
                 230)


def test_a_grouped_models_cache_holds_its_kv_heads_alone(gpu, plan):
    """2 key/value heads of 4: each layer's cache is the prefill's k and v as projected, [N * ctx, 2 * hd],
    half of [N * ctx, C]; the copies for the query heads are one scratch that every layer reuses
    (test_memory: the budget counts what the decoder allocates)."""
    from tinygpt.model import buffers
    cfg = preset("tiny", layers=3, d_model=24, heads=4, kv_heads=2, ctx=16)
    spec = decoder_spec(cfg, N=2)
    d = Decoder(gpu, decoding(plan, True), spec, capacity=4)
    b = d.model.buf
    assert all(t.shape == (2 * 16, 12) for t in b["k kv"] + b["v kv"])
    assert len({id(t.buf) for t in b["k kv"] + b["v kv"]}) == 6 and len({id(t.buf) for t in b["k"]}) == 1
    kv_bytes = lambda spec: sum(a.nbytes for a in buffers.model_rows(spec.with_(lm_head=False), plan, None)[0]
                                if a.row.name in ("k", "v", "k kv", "v kv"))
    full = decoder_spec(preset("tiny", layers=3, d_model=24, heads=4, ctx=16), N=2)
    print(f"the prefill's k and v: {kv_bytes(full):,} bytes with 4 key/value heads, {kv_bytes(spec):,} with 2")
    assert kv_bytes(full) == 4 * 2 * 3 * 32 * 24                   # [N * ctx, C] a layer, k and v
    assert kv_bytes(spec) == 4 * 2 * (3 * 32 * 12 + 32 * 24)       # [N * ctx, 2 * hd] a layer, one [N * ctx, C]



@pytest.mark.parametrize("half", ["bf16", "f16"])
@pytest.mark.parametrize("parts", [{}, dict(heads=6, kv_heads=2, position="rope"),
                                   dict(heads=4, head_dim=8, kv_heads=2, position="rope")])
def test_half_greedy_cached_equals_full_window_and_its_reference(gpu, plan, half, parts):
    """A bf16 or f16 model samples from its own cache (k, v as stored; a grouped model's holding its
    key/value heads alone): 100 greedy tokens with ctx 16 (the window restarts 11 times) equal the
    whole window's, token for token, and the float64 reference that rounds where the precision
    stores, but at a near-tie of its logits."""
    from tinygpt.core.precision import PRECISIONS
    precision = PRECISIONS[half]
    if precision.feature and precision.feature not in gpu.features:
        pytest.skip(f"{gpu.name} has no {precision.feature}")
    cfg = preset("tiny", layers=2, d_model=24, ctx=16, **{"heads": 3, **parts})
    params = spread(cfg)
    prompt, n = [5, 17, 99], 100
    got = {}
    for cache in (True, False):
        d = Decoder(gpu, decoding(plan, cache), decoder_spec(cfg, N=2, precision=precision), capacity=n)
        assert d.mode == ("cache" if cache else "full")
        d.set_params(params)
        got[cache] = d.generate(prompt, n)
    assert got[True] == got[False] and got[True][0] == got[True][1]
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    ids, s = list(prompt), 0
    for i in range(n):
        s = window_start(s, len(ids), cfg.ctx)
        z = RG.forward(p64, cfg, np.array([got[True][0][s:len(ids)]]), precision=precision)[0, -1]
        top = np.sort(z)[-2:]
        if int(np.argmax(z)) != got[True][0][len(ids)]:        # only where the reference nearly ties
            assert top[1] - top[0] < 3e-2 * max(1.0, abs(top[1])), f"token {len(ids)}: margin {top[1] - top[0]:.3g}"
        ids.append(got[True][0][len(ids)])
    print(f"{half} greedy: {n} tokens, cached = full window")


@pytest.mark.parametrize("vocab, limit, n, half, kv, hd", [
    (2000, 600_000, 40, None, 2, 0), (50257, 13_000_000, 12, None, 2, 0), (2000, 600_000, 40, "bf16", 2, 0),
    (2000, 600_000, 40, "f16", 2, 0), (2000, 600_000, 40, None, 1, 0), (2000, 600_000, 40, "bf16", 1, 0),
    (2000, 600_000, 40, None, 1, 32), (50257, 13_000_000, 12, None, 1, 32)])
def test_greedy_with_the_token_embedding_split_by_a_forced_limit(gpu, plan, monkeypatch, vocab, limit, n, half, kv,
                                                                 hd):
    """tok_emb [V, 128] over a forced limit (also GPT-2's vocabulary): embed_decode runs once per
    chunk of the table (each with its uniform) and the cached head goes through the block scratch;
    both paths and the reference agree, with tokens drawn from both chunks. In bf16 and f16 too
    (the half cache, the table's 16-bit copy in chunks): cached equals the whole window. kv 1: the
    two heads share one key/value head, so the cache holds it alone, in float32 and bf16. hd 32: the
    heads set apart from the width (q 64 wide in 128), the cache's kernels on their own uniform beside
    each chunk's embedding uniform, at GPT-2's vocabulary too."""
    from tinygpt.core.precision import FP32, PRECISIONS
    precision = PRECISIONS[half] if half else FP32
    if precision.feature and precision.feature not in gpu.features:
        pytest.skip(f"{gpu.name} has no {precision.feature}")
    cfg = preset("tiny", layers=1, d_model=128, heads=2, kv_heads=kv, ctx=16, vocab=vocab, head_dim=hd or None)
    params = spread(cfg, 4)
    monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
    got = {}
    for cache in (True, False):
        d = Decoder(gpu, decoding(plan, cache), decoder_spec(cfg, N=2, precision=precision), capacity=n)
        assert len(d.model.head.vchunks) == 2 and d.mode == ("cache" if cache else "full")
        edge = d.model.head.vchunks[1][0]
        d.set_params(params)
        prompt = [5, edge + 3, vocab - 1]                           # tokens of both chunks in the prompt
        got[cache] = d.generate(prompt, n)
    assert got[True] == got[False]
    assert min(got[True][0]) < edge <= max(got[True][0]), "tokens from one chunk only"
    if half:                     # the float32 reference's tokens are not a 16-bit model's
        return
    want, margins = reference_greedy(params, cfg, prompt, n)
    mismatch = next((i for i, (a, b) in enumerate(zip(got[True][0], want)) if a != b), None)
    if mismatch is not None:
        assert margins[mismatch - len(prompt)] < 1e-4, f"token {mismatch} differs at margin {margins[mismatch - 3]}"
        pytest.skip(f"a near-tie at token {mismatch} (margin {margins[mismatch - 3]:.2e})")


def test_sampled_cached_equals_full_window(gpu, plan):
    cfg = preset("tiny", layers=2, d_model=24, heads=3, ctx=16)
    params = spread(cfg, 1)
    out = {}
    for cache in (True, False):
        d = Decoder(gpu, decoding(plan, cache), decoder_spec(cfg, N=3), capacity=60)
        d.set_params(params)
        out[cache] = d.generate([1, 2, 3], 60, temperature=0.9, top_k=30, top_p=0.9, seed=11)
    assert out[True] == out[False]
    assert len({tuple(s) for s in out[True]}) == 3          # three different continuations
    d = Decoder(gpu, decoding(plan, True), decoder_spec(cfg, N=3), capacity=60)
    d.set_params(params)
    assert d.generate([1, 2, 3], 60, temperature=0.9, top_k=30, top_p=0.9, seed=11) == out[True]  # seeded
    assert d.generate([1, 2, 3], 60, temperature=0.9, top_k=30, top_p=0.9, seed=12) != out[True]


def test_prompt_longer_than_the_window_and_ctx_one(gpu, plan):
    cfg = preset("tiny", layers=1, d_model=8, heads=2, ctx=1)
    params = spread(cfg, 2)
    for cache in (True, False):
        d = Decoder(gpu, decoding(plan, cache), decoder_spec(cfg), capacity=5)
        d.set_params(params)
        seq = d.generate([3, 1, 4, 1, 5], 5)[0]
        want, _ = reference_greedy(params, cfg, [3, 1, 4, 1, 5], 5)
        assert seq == want


def test_sample_cli_batches_and_matches_without_the_cache(tmp_path, capsys):
    from tinygpt.files import checkpoint as ckpt
    from tinygpt.commands.cli import main
    cfg = preset("tiny", layers=1, d_model=16, heads=2, ctx=16)
    m = tmp_path / "m.tinygpt"
    ckpt.save(m, ckpt.Checkpoint(cfg, spread(cfg, 3), None, None, 0, [], {"tokenizer": "byte"}))
    args = ["sample", "--model", str(m), "--prompt", "Hi", "--tokens", "40", "--temperature", "0.8",
            "--top-k", "50", "--top-p", "0.9", "--seed", "5", "--num-samples", "3"]
    outs = []
    for extra in ([], ["--no-cache"]):
        assert main(args + extra) == 0
        captured = capsys.readouterr()
        outs.append(captured.out)
    assert outs[0] == outs[1] and outs[0].count("---- sample ") == 3
    assert "key/value cache" in captured.err or "whole window" in captured.err
    assert main(args[:-2] + ["--top-p", "0"]) == 2 and "--top-p" in capsys.readouterr().err


def test_prefill_rows_hold_the_prompt_with_at_most_a_third_spare():
    """A prompt's prefill runs over 16, 24, 32, 48, 64, ... rows: every prompt fits, at most a third
    of the rows past 16 are spare, never more than the window, and two sizes an octave."""
    from tinygpt.model.decode import prefill_rows
    sizes = {prefill_rows(8192, n) for n in range(1, 8193)}
    assert sorted(sizes)[:6] == [16, 24, 32, 48, 64, 96] and max(sizes) == 8192 and len(sizes) == 19
    for n in range(1, 8193):
        rows = prefill_rows(8192, n)
        assert n <= rows and (rows == 16 or n > rows * 2 // 3), (n, rows)
    assert prefill_rows(40, 37) == 40 and prefill_rows(40, 3) == 16
