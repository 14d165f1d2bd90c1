"""Evaluation reads the loss of every row: logits split over bindings (the limit forced low,
and the GPT-2 vocabulary at the small preset, which splits on lavapipe by itself) against
the float64 reference over several windows, a padded last batch included."""
import numpy as np
import pytest

from conftest import check
from tinygpt.core.config import preset
from tinygpt.model.gpt import Model
from tinygpt.reference import gpt as RG
from tinygpt.core.init import init_params
from tinygpt.model.spec import RunSpec

pytestmark = pytest.mark.kernel


def ref_mean_loss(params, cfg, xs, ys):
    """float64 reference: the mean of every window's per-token losses."""
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    total = 0.0
    for x, y in zip(xs, ys):
        _, loss, _ = RG.forward(p64, cfg, x[None], y[None])
        total += float(loss)
    return total / len(xs)


def spread_params(cfg, seed=0):
    """Init, then a larger embedding so that per-row losses differ (at init they are all ~ln V)."""
    p = init_params(cfg)
    r = np.random.default_rng(seed)
    p["tok_emb"] = (r.standard_normal(p["tok_emb"].shape) * 0.5).astype(np.float32)
    return p


def windows(V, n, T, seed=1):
    w = np.random.default_rng(seed).integers(0, V, (n, T + 1)).astype(np.uint32)
    return w[:, :-1], w[:, 1:]


def test_eval_with_the_binding_limit_forced_low(gpu, plan, monkeypatch):
    """Four chunks of 64 rows of [256, 2000] logits; 21 windows at B=16 (a padded last batch):
    every chunk's rows count, in the trainer's model and in an evaluation-only one."""
    cfg = preset("tiny", layers=1, d_model=16, heads=2, batch=16, ctx=16, vocab=2000)
    params = spread_params(cfg)
    xs, ys = windows(cfg.vocab, 21, cfg.ctx)
    want = ref_mean_loss(params, cfg, xs, ys)
    got = {}
    for limit in (None, 600_000):
        if limit:
            monkeypatch.setitem(gpu.limits, "max-storage-buffer-binding-size", limit)
        for training in (True, False):  # the trainer's validation and `tinygpt eval`
            m = Model(gpu, plan, RunSpec(cfg, "online", training=training))
            m.set_params(params)
            got[(limit, training)] = (len(m.layout.logit_chunks), m.mean_loss(xs, ys))
    assert got[(None, True)][0] == 1 and got[(600_000, False)][0] == 4
    for key, (_, loss) in got.items():
        check(f"mean loss, limit {key[0]}, training={key[1]}", loss, want, atol=2e-5, rtol=2e-6)


def test_eval_gpt2_vocabulary_small_preset(gpu, plan):
    """V = 50257 at the small preset: [1024, 50264] logits exceed lavapipe's 134 MB binding."""
    cfg = preset("small", vocab=50257)
    params = spread_params(cfg)
    m = Model(gpu, plan, RunSpec(cfg, "online", training=False))
    m.set_params(params)
    print(f"logit chunks: {len(m.layout.logit_chunks)} ({m.layout.logit_chunks[:2]}...)")
    n = cfg.batch + 3                       # two batches, the second padded
    xs, ys = windows(cfg.vocab, n, cfg.ctx)
    want = ref_mean_loss(params, cfg, xs, ys)
    got = m.mean_loss(xs, ys)
    check("gpt2-vocab small mean loss", got, want, atol=1e-4, rtol=2e-6)
    # and each batch on its own, read as one reduced number
    check("gpt2-vocab small one batch", m.mean_loss(xs[:cfg.batch], ys[:cfg.batch]),
          ref_mean_loss(params, cfg, xs[:cfg.batch], ys[:cfg.batch]), atol=1e-4, rtol=2e-6)
