"""Sliding-window attention (upstream's slidingWindow: each query sees its last W positions,
itself included) on every path, in the decode step, in the model in every precision, in files
and on the command line, against the float64 reference and an independent float64 model."""
import contextlib
import io
import json
import math

import numpy as np
import pytest

from conftest import check
from upstream import fp16_state, header_of, upstream_file, with_config
from test_model import check_step0
from support import in_process as cli, one_line_error
from tinygpt.files import checkpoint as ckpt
from tinygpt.core.config import Config, preset
from tinygpt.core.init import init_params
from tinygpt.core.precision import PRECISIONS
from tinygpt.device import kernels as K
from tinygpt.device.kernels import Kernels
from tinygpt.device.planner import make_plan
from tinygpt.model import attention
from tinygpt.model.gpt import Model
from tinygpt.reference import attention as RA
from tinygpt.reference import gpt as RG
from tinygpt.reference import kernels as R
from tinygpt.model.spec import RunSpec

pytestmark = pytest.mark.kernel
TOL = 2e-5          # absolute, as test_attention's: inputs ~N(0,1), outputs O(1)


def _inputs(B, T, C, seed=0):
    r = np.random.default_rng(seed)
    return [r.standard_normal((B, T, C)).astype(np.float32) for _ in range(4)]


def f64(x):
    return {k: v.astype(np.float64) for k, v in x.items()} if isinstance(x, dict) else x.astype(np.float64)


# ---- the twins ---------------------------------------------------------------------------------
@pytest.mark.parametrize("T, W, BQ, BK", [(37, 5, 8, 8), (70, 1, 32, 32), (65, 17, 16, 8), (9, 8, 8, 16)])
def test_the_twins_walk_only_the_window_and_agree_with_the_mask(T, W, BQ, BK):
    """The tiled twins (which skip the tiles the kernels skip) and the score-matrix twins against the
    plain float64 judge with the window's mask."""
    q, k, v, do = (f64(a) for a in _inputs(2, T, 12))
    H = 3
    want = RA.attention_forward(q, k, v, H, window=W)
    wdq, wdk, wdv = RA.attention_backward(q, k, v, do, H, window=W)
    out, L = RA.attn_online_forward(q, k, v, H, BQ, BK, window=W)
    D = RA.attn_online_d(do, out, H)
    check(f"online twin out T={T} W={W}", out, want, 1e-12)
    check("online twin dq", RA.attn_online_dq(q, k, v, do, L, D, H, BQ, BK, window=W), wdq, 1e-12)
    for got, w, n in zip(RA.attn_online_dkv(q, k, v, do, L, D, H, BQ, BK, window=W), (wdk, wdv), "kv"):
        check(f"online twin d{n}", got, w, 1e-12)
    o2, P = RA.attn_fused_sv(q, k, v, H, window=W)
    check("fused twin out", o2, want, 1e-12)
    assert not P[..., ~RA.causal_mask(T, W)].any()          # nothing outside the window
    dS = RA.attn_dscores(do, v, P, H, window=W)
    check("score twins dq", RA.attn_dq(dS, k, H, window=W), wdq, 1e-12)
    # a window: fewer key tiles than plain causal attention, from the first query row's oldest key
    assert list(RA.key_tiles(64, 64 + BQ - 1, BK, W))[0] == (64 - W + 1) // BK * BK


# ---- the kernels -------------------------------------------------------------------------------
def kernels_for(gpu, impl):
    plan = make_plan(gpu, tuning={})
    if impl == "online-tiles":                 # online.wgsl, where this adapter's plan takes online_sg.wgsl
        return attention.path("online"), Kernels(gpu, plan.with_(attention="tiles"))
    return attention.path(impl), Kernels(gpu, plan)


# (B, T, C, H, W, tiles): odd T and head dims; W = 1 (only itself), W crossing tiles, W = T - 1
SHAPES = [(2, 37, 15, 3, 5, (8, 8)), (1, 70, 24, 2, 1, (16, 8)), (1, 65, 26, 2, 17, (8, 16)),
          (2, 9, 8, 2, 8, None), (1, 33, 128, 1, 12, (8, 8))]


@pytest.mark.parametrize("impl", attention.IMPLS + ("online-tiles",))
@pytest.mark.parametrize("B, T, C, H, W, tiles", SHAPES)
def test_windowed_attention_against_float64(gpu, impl, B, T, C, H, W, tiles):
    """out, dq, dk, dv with the window; online.wgsl's tiles forced small (8 and 16 rows), so that
    whole tiles are skipped and windows start inside a tile."""
    path, kn = kernels_for(gpu, impl)
    q, k, v, do = _inputs(B, T, C)
    gpu_ = kn.gpu
    att = path.bind(kn, B, T, C, H, path.own_scratch(gpu_, B, T, H), W,
                    block=tiles if impl == "online-tiles" else None)
    tq, tk, tv, tdo = (gpu_.upload(a) for a in (q, k, v, do))
    out, dq, dk, dv = (gpu_.tensor((B, T, C)) for _ in range(4))
    gpu_.run(att.forward(tq, tk, tv, out) + att.backward(tq, tk, tv, out, tdo, dq, dk, dv))
    want = RA.attention_forward(f64(q), f64(k), f64(v), H, window=W)
    wants = RA.attention_backward(f64(q), f64(k), f64(v), f64(do), H, window=W)
    tag = f"{impl} B={B} T={T} C={C} H={H} W={W}"
    check(f"{tag} out", gpu_.read(out), want, TOL)
    for name, got, w in zip(("dq", "dk", "dv"), (dq, dk, dv), wants):
        check(f"{tag} {name}", gpu_.read(got), w, TOL)
    if path.keeps_weights:                     # what inspect draws: zeros outside each query's window
        P = np.concatenate([gpu_.read(t).reshape(B, nh, T, T) for _, nh, t in att.weights()], axis=1)
        check(f"{tag} P", P, RA.attn_softmax(RA.attn_scores(f64(q), f64(k), H, W), W), 1e-6)


def test_score_paths_split_by_heads_under_a_forced_limit(gpu, monkeypatch):
    """The binding limit forced low: the score matrix in three head chunks, with a window."""
    B, T, C, H, W = 1, 40, 24, 3, 7
    monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", 4 * B * T * T)
    for impl in ("naive", "fused_sv"):
        path, kn = kernels_for(gpu, impl)
        assert len(path.own_scratch(gpu, B, T, H)["chunks"]) == 3
        q, k, v, do = _inputs(B, T, C, 3)
        check(f"{impl} 3 chunks W={W} out", attention.forward(kn, q, k, v, H, impl, W),
              RA.attention_forward(f64(q), f64(k), f64(v), H, window=W), TOL)
        dq, _, _ = attention.backward(kn, q, k, v, do, H, impl, W)
        check(f"{impl} 3 chunks dq", dq, RA.attention_backward(f64(q), f64(k), f64(v), f64(do), H, window=W)[0], TOL)


@pytest.mark.parametrize("pos, W", [(3, 8), (12, 8), (69, 5), (69, 1)])
@pytest.mark.parametrize("half", [None, "bf16", "f16"])
def test_attn_decode_sees_the_window(gpu, pos, W, half):
    """decode.wgsl's attention over the cache: the last W rows up to pos (all where pos < W)."""
    N, T, C, H = 2, 70, 24, 3
    r = np.random.default_rng(pos)
    q, kc, vc = r.standard_normal((N, C)), r.standard_normal((N, T, C)), r.standard_normal((N, T, C))
    kn = Kernels(gpu, make_plan(gpu))
    u = gpu.uniform(K.DECODE_UNIFORM_BYTES)
    gpu.queue.write_buffer(u, 0, K.decode_uniform(N=N, T=T, C=C, H=H, pos=pos, step=0, V=256, VP=256))
    out, scratch = gpu.tensor((N, C)), gpu.tensor((N, H, T))
    if half is None:
        tq, tk, tv = (gpu.upload(a.astype(np.float32)) for a in (q, kc, vc))
        gpu.run([kn.decoding.attn_decode(tq, tk, tv, out, scratch, N, H, u, W)])
        want = R.attn_decode(q, kc, vc, pos, H, W)
    else:
        if half == "f16" and "shader-f16" not in gpu.features:
            pytest.skip(f"{gpu.name} has no shader-f16, so no f16 model")
        cast = R.cast_bf16 if half == "bf16" else R.cast_f16
        words = [cast(a.astype(np.float32)).reshape(*a.shape[:-1], C // 2) for a in (q, kc, vc)]
        tq, tk, tv = (gpu.tensor(w.shape, half, data=w) for w in words)
        gpu.run([kn.decoding.attn_decode(tq, tk, tv, out, scratch, N, H, u, W)])
        want = R.stored_attn_decode(*words, pos, H, half, W)
    check(f"attn_decode {half or 'f32'} pos={pos} W={W}", gpu.read(out), want, 2e-5)


# ---- the model ---------------------------------------------------------------------------------
def batch(cfg, seed=0):
    x = np.random.default_rng(seed).integers(0, cfg.vocab, (cfg.batch, cfg.ctx + 1))
    return x[:, :-1], x[:, 1:]


SLOW = pytest.mark.slow     # the Vulkan pass runs these; GL's kernel run (no subgroups: minutes) the rest


@pytest.mark.parametrize("impl, precision", [("online", "fp32"), ("naive", "fp32"),
                                             pytest.param("fused_sv", "fp32", marks=SLOW),
                                             pytest.param("online", "bf16", marks=SLOW), ("online", "f16"),
                                             pytest.param("naive", "bf16", marks=SLOW)])
def test_step0_of_a_windowed_model_against_its_reference(gpu, impl, precision):
    """Logits, loss and every gradient of a tiny model with window 5 (ctx 32), on each path and in
    each precision, against the float64 reference with that window (tolerances as test_model's)."""
    from tinygpt.device.kernels import LOSS_SCALE
    policy = PRECISIONS[precision]
    if policy.feature and policy.feature not in gpu.features:
        pytest.skip(f"{gpu.name} has no {policy.feature}")
    cfg = preset("tiny", window=5)
    assert cfg.attn_window == 5
    params = init_params(cfg)
    x, y = batch(cfg)
    scale = LOSS_SCALE if policy.loss_scaling else 1.0
    logits, loss, cache = RG.forward(f64(params), cfg, x, y, precision=policy)
    grads = RG.backward(f64(params), cfg, cache, loss_scale=scale)
    plain = RG.forward(f64(params), preset("tiny"), x, y)[0]
    assert np.abs(plain - logits).max() > 1e-3            # the window changes what the model computes
    m = Model(gpu, make_plan(gpu), RunSpec(cfg, impl, precision=policy))
    m.set_params(params)
    tol = 1e-4 if precision == "fp32" else 3e-3
    check(f"{impl} {precision} W=5 logits", m.logits_of(x), logits, tol * np.abs(logits).max())
    m.grads_only(x, y)
    check(f"{impl} {precision} W=5 loss", m.loss(), loss, 1e-4 * abs(loss))
    G = m.get_grads()
    for name, want in grads.items():
        top = max(np.abs(want).max(), 1e-6 if precision == "fp32" else 1e-4)
        check(f"{impl} {precision} W=5 grad {name}", G[name] / scale, want, tol * top)


@pytest.mark.parametrize("impl", ["online", pytest.param("naive", marks=SLOW)])
def test_greedy_cached_equals_full_window_and_reference_with_a_window(gpu, impl):
    """60 greedy tokens of a model with window 5, ctx 16 (the context restarts on the way): from
    the cache, by the whole window per token, and by the float64 reference, alike."""
    from test_decode import check_greedy
    check_greedy(gpu, make_plan(gpu), preset("tiny", layers=2, d_model=24, heads=3, ctx=16, window=5), impl,
                 [5, 17, 99], 60)


def test_step0_windowed_gpt2_vocabulary_with_the_token_embedding_split_by_a_forced_limit(gpu, monkeypatch):
    """A window with GPT-2's vocabulary under a 13 MB binding limit (test_model's split: the token
    table [50264, 128] in 2 chunks, the flat buffers in chunks): the gradients the window changes
    and the split ones against the float64 reference."""
    cfg = preset("tiny", layers=1, d_model=128, heads=2, vocab=50257, batch=2, ctx=16, window=3)
    n, m = check_step0(gpu, make_plan(gpu), cfg, names=("tok_emb", "pos_emb", "h0.Wq", "h0.Wk", "ln_f_g"),
                       limit=13_000_000, monkeypatch=monkeypatch, keep=True)
    assert len(m.head.vchunks) == 2 and len(m.layout.flat_chunks) > 1


# ---- files, from outside -----------------------------------------------------------------------
def independent_loss(p: dict, cfg: Config, x: np.ndarray, y: np.ndarray, window: int) -> float:
    """A GPT written here from the architecture's definition (float64; pre-LayerNorm blocks,
    exact GELU, tied head), with a sliding window of `window` positions; the mean token loss."""
    erf = np.vectorize(math.erf)
    C, H = cfg.d_model, cfg.heads
    hd = C // H

    def ln(a, g, b):
        mu = a.mean(-1, keepdims=True)
        return (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

    B, T = x.shape
    h = p["tok_emb"][x] + p["pos_emb"][:T]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = (j <= i) & (i - j < window)
    for l in range(cfg.layers):
        P = lambda n: p[f"h{l}.{n}"]
        a = ln(h, P("ln1_g"), P("ln1_b"))
        q, k, v = (a @ P(f"W{n}") + P(f"b{n}") for n in "qkv")
        split = lambda t: t.reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        s = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(hd)
        s = np.where(allowed, s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        h = h + (w @ split(v)).transpose(0, 2, 1, 3).reshape(B, T, C) @ P("Wo") + P("bo")
        a = ln(h, P("ln2_g"), P("ln2_b")) @ P("fc_in_W") + P("fc_in_b")
        h = h + (0.5 * a * (1 + erf(a / math.sqrt(2)))) @ P("fc_out_W") + P("fc_out_b")
    z = ln(h, p["ln_f_g"], p["ln_f_b"]) @ p["tok_emb"].T
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, y[..., None], -1).mean())


@SLOW
def test_an_upstream_file_with_a_window_evaluates_as_an_independent_model(tmp_path):
    """An upstream-layout file (built byte by byte as upstream writes it: test_format) whose config
    sets slidingWindow 8 at ctx 32: tinygpt eval's loss on every path equals that of a float64 model
    written here with that window, and differs from the same weights without it."""
    cfg = Config(layers=2, d_model=48, heads=3, ctx=32, batch=4, vocab=256)
    rng = np.random.default_rng(5)
    params = {k: (v + rng.standard_normal(v.shape).astype(np.float32) * 0.3) for k, v in init_params(cfg).items()}
    f = tmp_path / "w.tinygpt"
    f.write_bytes(with_config(upstream_file(cfg, {"includesOptimizerState": False, "weightDtype": "fp16"},
                                            fp16_state(cfg, params)), slidingWindow=8))
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(rng.integers(32, 127, 3000).astype(np.uint8)))
    held = ckpt.load(f)
    assert held.cfg.window == 8
    from tinygpt.tokenizers import get_tokenizer
    from tinygpt.files.tokenfile import open_dataset
    xs, ys = open_dataset(str(text), get_tokenizer("byte"), 32).val_windows()
    p16 = {k: v.astype(np.float16).astype(np.float64) for k, v in params.items()}   # as the fp16 file holds them
    want = independent_loss(p16, cfg, xs.astype(np.int64), ys.astype(np.int64), 8)
    plain = independent_loss(p16, cfg, xs.astype(np.int64), ys.astype(np.int64), 32)
    assert abs(want - plain) > 1e-3
    for impl in attention.IMPLS:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc, err = cli("eval", "--model", f, "--data", text, "--json", "--attention", impl)
        assert rc == 0, err
        got = json.loads(buf.getvalue())["loss"]
        check(f"eval {impl}, slidingWindow 8, {len(xs)} windows", got, want, 2e-5, 2e-6)


@SLOW                      # whole runs through the CLI
def test_train_with_a_window_trains_samples_and_resumes_on_every_path(tmp_path):
    """--sliding-window 16 at ctx 32: trains and samples on every attention path; the header
    records slidingWindow; a resume keeps it, and one that contradicts it is refused."""
    text = tmp_path / "t.txt"
    text.write_text("It was the best of times, it was the worst of times. " * 40)
    for impl in attention.IMPLS:
        out = tmp_path / f"{impl}.tinygpt"
        rc, err = cli("train", "--preset", "tiny", "--batch", 4, "--steps", 2, "--data", text, "--out", out,
                      "--quiet", "--sample-tokens", 0, "--eval-every", 0, "--sliding-window", 16,
                      "--attention", impl)
        assert rc == 0, err
        assert header_of(out.read_bytes())["config"]["slidingWindow"] == 16
        rc, err = cli("sample", "--model", out, "--tokens", 8, "--prompt", "It was", "--attention", impl)
        assert rc == 0, err
    rc, err = cli("train", "--resume", out, "--steps", 3, "--data", text, "--quiet", "--sample-tokens", 0,
                  "--eval-every", 0)
    assert rc == 0, err and ckpt.load(out).cfg.window == 16
    rc, err = cli("train", "--resume", out, "--steps", 6, "--data", text, "--quiet", "--sliding-window", 8,
                  "--eval-every", 0)
    one_line_error(rc, err, "--sliding-window 8 (file: 16)")


@SLOW
def test_hugging_face_export_refuses_a_windowed_model(tmp_path):
    """GPT-2 has no window: the export says so in one line and writes nothing."""
    text = tmp_path / "t.txt"
    text.write_text("abc " * 500)
    f = tmp_path / "w.tinygpt"
    rc, err = cli("train", "--preset", "tiny", "--batch", 4, "--steps", 1, "--data", text, "--out", f,
                  "--quiet", "--sample-tokens", 0, "--eval-every", 0, "--sliding-window", 8)
    assert rc == 0, err
    rc, err = cli("export", "--model", f, "--format", "hf", tmp_path / "hf")
    one_line_error(rc, err, "slidingWindow 8")
    assert not (tmp_path / "hf").exists()
