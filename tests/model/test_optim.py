"""The optimizers as the model runs them: whole steps of AdamW, Lion and Muon against the float64
reference (fp32, with accumulation and recompute), Muon's update against torch.optim.Muon where
torch is installed, and one step from a saved checkpoint checked from the files alone."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tinygpt.files import checkpoint as ckpt
from tinygpt.files import optim_state
from tinygpt.core.config import param_shapes, preset
from tinygpt.core.init import init_params
from tinygpt.model.optimizers import kind, make_settings
from tinygpt.model.optimizers.muon import is_muon_matrix, muon_ratio, newton_schulz_twin
from tinygpt.model.gpt import Model
from tinygpt.model.spec import RunSpec
from tinygpt.reference import gpt as RG
from tinygpt.reference import kernels as R

from conftest import check

LR = {"adamw": 1e-3, "lion": 1e-4, "muon": 1e-3, "sgd": 0.3}
STATE_ROWS = {name: kind(name).state_rows for name in LR}
newton_schulz = lambda x: newton_schulz_twin(R, x)


def batch(cfg, seed=0, n=None):
    x = np.random.default_rng(seed).integers(0, cfg.vocab, (n or cfg.batch, cfg.ctx + 1))
    return x[:, :-1], x[:, 1:]


def f64(d):
    return {k: v.astype(np.float64) for k, v in d.items()}


def close_or_flipped(name, got, want, lr, atol=2e-6):
    """Lion moves each weight by exactly lr: where the float32 sum a sign is taken of lies within
    round-off of zero, the device's sign may differ from float64's. Such flips (at most 2 lr each)
    are counted and bounded; every other weight is held to atol."""
    err = np.abs(np.asarray(got, np.float64) - want)
    flipped = err > atol
    print(f"{name:40s} maxdiff={err.max():.3e}, {int(flipped.sum())} of {err.size} past {atol:g}")
    assert flipped.mean() < 1e-3 and err.max() <= 2 * lr * 5 + atol


@pytest.mark.kernel
@pytest.mark.parametrize("opt,accum,recompute", [                  # the slow-marked ones: the first pass only
    pytest.param("adamw", 1, False, marks=pytest.mark.slow), ("lion", 1, False), ("muon", 1, False), ("sgd", 1, False),
    pytest.param("lion", 2, True, marks=pytest.mark.slow), pytest.param("muon", 2, True, marks=pytest.mark.slow)])
def test_steps_of_each_optimizer_match_float64(gpu, plan, opt, accum, recompute):
    """Five steps of each optimizer on the tiny preset (its 48 x 192 and 192 x 48 MLP matrices: a
    tall one for Muon), the loss of each step and then every parameter and every row of the
    optimizer's state against the float64 reference; with two micro-batches and recompute too."""
    cfg = preset("tiny")
    s = make_settings(opt)
    params = init_params(cfg)
    ref = f64(params)
    state = RG.new_opt_state(ref, s)
    m = Model(gpu, plan, RunSpec(cfg, "online", B=cfg.batch // accum, accum=accum, recompute=recompute, optimizer=s))
    m.set_params(params)
    lr = LR[opt]
    for step in range(5):
        x, y = batch(cfg, step)
        m.step(x, y, lr)
        _, loss, cache = RG.forward(ref, cfg, x, y)
        RG.clip_and_step(ref, RG.backward(ref, cfg, cache), state, cfg, lr, s)
        check(f"{opt} step {step} loss", m.loss(), loss, 1e-4)
    got, held = m.get_params(), m.get_opt_state()
    assert m.opt_steps() == state["t"] == 5
    # bk's exact gradient is zero (softmax ignores a per-row shift): what the device computes for it
    # is round-off, which AdamW and Lion normalise to steps of size lr, so it is not compared
    params = {n: a for n, a in params.items() if not n.endswith(".bk")}
    for name in params:
        if opt == "lion":
            close_or_flipped(f"lion {name}", got[name], ref[name], lr)
        else:
            # AdamW divides by sqrt(v): a coordinate whose gradient is near round-off moves by up to
            # lr in a direction round-off picks, so the bound is a share of lr, not of the weight
            check(f"{opt} {name} after 5 steps", got[name], ref[name], 0.02 * lr)
    for row in STATE_ROWS[opt]:
        for name in params:
            scale = max(np.abs(state[row][name]).max(), 1e-12)
            check(f"{opt} {row} {name}", held[row][name], state[row][name], 1e-4 * scale)


@pytest.mark.kernel
def test_muon_leaves_no_matrix_to_adamw(gpu, plan):
    """Muon's AdamW part never touches a matrix (its v stays zero there) and Muon's own kernels
    never touch the rest; the decay table marks which is which."""
    cfg = preset("tiny")
    m = Model(gpu, plan, RunSpec(cfg, "online", optimizer=make_settings("muon")))
    m.set_params(init_params(cfg))
    m.step(*batch(cfg), 1e-3)
    v = m.get_opt_state()["muon v"]
    mats = [n for n in v if is_muon_matrix(n)]
    assert len(mats) == 6 * cfg.layers and not any(v[n].any() for n in mats)
    assert all(v[n].any() for n in ("tok_emb", "ln_f_g", "h0.bq"))


TORCH_MUON = r"""
import sys
import numpy as np
import torch
import torch.optim._muon as muon
d = np.load(sys.argv[1])

def step():
    w = torch.nn.Parameter(torch.tensor(d["w"].T.copy()))         # PyTorch's [out, in]
    opt = torch.optim.Muon([w], lr=float(d["lr"]), weight_decay=float(d["wd"]), momentum=0.95, nesterov=True,
                           adjust_lr_fn="match_rms_adamw")
    opt.state[w]["momentum_buffer"] = torch.tensor(d["m"].T.copy())
    w.grad = torch.tensor(d["g"].T.copy())
    opt.step()
    return w.detach().numpy().T

stock = step()
bf16 = torch.Tensor.bfloat16
torch.Tensor.bfloat16 = lambda t: t.float()         # the same iterations, in float32
as_f32 = step()
torch.Tensor.bfloat16 = bf16
np.save(sys.argv[2], np.stack([stock, as_f32]))
print(torch.__version__)
"""


@pytest.mark.parametrize("K_,N", [(48, 192), (192, 48), (37, 21)])
def test_muon_matches_torch(gpu, kn, tmp_path, K_, N):
    """One Muon update of a matrix on the device against torch.optim.Muon (adjust_lr_fn
    "match_rms_adamw", momentum 0.95, Nesterov). torch runs its Newton-Schulz in bfloat16, so the
    stock update agrees to bf16's precision (3 % of its size); with torch's iterations run in
    float32 instead (its bfloat16 cast made a no-op), to 1e-4. Runs where torch imports (pip
    install torch==2.13.0); torch runs in a process of its own (beside lavapipe's LLVM it crashed)."""
    if subprocess.run([sys.executable, "-c", "import torch.optim; torch.optim.Muon"], capture_output=True).returncode:
        pytest.skip("torch with torch.optim.Muon is not installed: pip install torch==2.13.0 runs this check")
    from tinygpt.device import kernels as K
    from tinygpt.model.optimizers.muon import newton_schulz as ns_device
    rng = np.random.default_rng(3)
    w, g, m = (rng.standard_normal((K_, N)).astype(np.float32) * s for s in (0.02, 1.0, 0.5))
    lr, wd, ratio, n, r = 1e-2, 0.1, muon_ratio((K_, N)), K_ * N, min(K_, N)
    words = np.zeros(K.GATE_FLOATS, np.float32)
    words[K.GATE["factor"]] = 1.0
    gate, tw, tm = gpu.upload(words), gpu.upload(w), gpu.upload(m)
    xs = [gpu.tensor((K_, N)), gpu.tensor((K_, N))]
    ns, out = ns_device(kn, xs, gpu.tensor((K_, N)), gpu.tensor((r, r)), gpu.tensor((r, r)), gpu.tensor((r, r)), K_, N)
    u = gpu.uniform(16)
    gpu.write_uniform(u, K.pack_uniform((0, lr, wd, 0)))
    gpu.run([kn.optim.muon_momentum(gpu.upload(g), gate, tm, xs[0], n, 0.95, True)] + ns
            + [kn.optim.muon_update(out, gate, tw, n, ratio, u)])
    ours = gpu.read(tw) - w
    np.savez(tmp_path / "in.npz", w=w, g=g, m=m, lr=lr, wd=wd)
    done = subprocess.run([sys.executable, "-c", TORCH_MUON, str(tmp_path / "in.npz"), str(tmp_path / "out.npy")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for what, theirs, bound in zip(("stock (bf16)", "float32"), np.load(tmp_path / "out.npy") - w, (0.03, 1e-4)):
        rel = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
        print(f"muon {K_}x{N} against torch {done.stdout.strip()} {what}: update relative error {rel:.2e}")
        assert rel < bound, what


def run_cli(*args, cwd):
    env = dict(os.environ, TINYGPT_WEBGPU=os.environ.get("TINYGPT_WEBGPU", ""))
    done = subprocess.run([sys.executable, "-m", "tinygpt", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.parametrize("opt", ["adamw", "lion", "muon", "sgd"])
def test_one_step_from_a_file_moves_the_weights_as_defined(tmp_path, opt):
    """From outside, from the files alone: a run of 4 steps is saved, then resumed for one step at
    a constant lr with no weight decay. The gradient of that step is recovered from the state
    before and after it (every optimizer's first moment mixes it in linearly), and the weights
    must have moved exactly as the optimizer is defined to: AdamW by lr m^ / (sqrt(v^) + eps);
    Lion by lr in every coordinate, against the sign of beta1 m + (1 - beta1) g; Muon's matrices
    by lr 0.2 sqrt(max(shape)) times Newton-Schulz of the Nesterov momentum, the rest by AdamW;
    SGD by lr times its momentum, the running mean."""
    common = ["--preset", "tiny", "--quiet", "--sample-tokens", "0", "--eval-every", "0"]
    run_cli("train", *common, "--steps", "4", "--optimizer", opt, "--out", "a.tinygpt", cwd=tmp_path)
    a = ckpt.load(tmp_path / "a.tinygpt")
    lr = 2e-3
    run_cli("train", *common, "--resume", "a.tinygpt", "--out", "b.tinygpt", "--steps", "5", "--schedule",
            "constant", "--lr", str(lr), "--weight-decay", "0", cwd=tmp_path)
    b = ckpt.load(tmp_path / "b.tinygpt")
    assert b.step == 5
    s = make_settings(opt)
    sa, sb = (optim_state.read(ck, s, param_shapes(a.cfg), "the file")[0] for ck in (a, b))
    t = b.extra.get("adamSteps", b.extra["optimizer"].get("steps"))
    assert t == 5
    worst = 0.0
    for name in a.params:
        w0, w1 = a.params[name].astype(np.float64), b.params[name].astype(np.float64)
        if opt == "lion":
            m0, m1 = sa["lion m"][name].astype(np.float64), sb["lion m"][name].astype(np.float64)
            g = (m1 - s.beta2 * m0) / (1 - s.beta2)
            c = s.beta1 * m0 + (1 - s.beta1) * g
            moved = np.abs(w1 - w0)
            clear = np.abs(c) > 1e-4 * np.abs(c).max()          # a sign not within round-off of zero
            assert np.allclose(moved, lr, rtol=1e-3), name
            assert np.array_equal(np.sign(w0 - w1)[clear], np.sign(c)[clear]), name
            continue
        rows = STATE_ROWS[opt]
        if opt == "sgd":
            want = w0 - lr * sb["sgd m"][name].astype(np.float64)
        elif opt == "muon" and is_muon_matrix(name):
            m0, m1 = sa["muon m"][name].astype(np.float64), sb["muon m"][name].astype(np.float64)
            g = (m1 - s.momentum * m0) / (1 - s.momentum)
            want = w0 - lr * muon_ratio(w0.shape) * newton_schulz((1 - s.momentum) * g + s.momentum * m1)
        else:
            m1, v1 = sb[rows[0]][name].astype(np.float64), sb[rows[1]][name].astype(np.float64)
            want = w0 - lr * (m1 / (1 - s.beta1 ** t)) / (np.sqrt(v1 / (1 - s.beta2 ** t)) + s.eps)
        err = np.abs(w1 - want).max() / lr
        worst = max(worst, err)
        assert err < 2e-3, f"{opt} {name}: moved {err:.2e} lr away from its definition"
    print(f"{opt}: the largest distance from the definition, in units of lr: {worst:.2e}")
    assert json.loads(json.dumps(b.extra["optimizer"]))["name"] == opt


def upstream_read(raw: bytes) -> tuple[dict, dict, dict]:
    """What upstream's python_ref/load_tinygpt.py does with a file, header checks none: after the
    step, per manifest entry, the weights and two moment slots, float32 each -> (w, m, v) by
    upstream name."""
    n = int.from_bytes(raw[8:12], "little")
    header, at = json.loads(raw[12:12 + n]), 12 + n + 4
    out = ({}, {}, {})
    for e in header["manifest"]:
        size = int(np.prod(e["shape"]))
        for d in out:
            d[e["name"]] = np.frombuffer(raw[at:at + 4 * size], "<f4").reshape(e["shape"])
            at += 4 * size
    return out


def test_lion_and_muon_resume_bit_for_bit_and_files_upstream_reads(tmp_path):
    """6 steps straight, or 3 then a resume to 6, give the same weights and optimizer state bit for
    bit (constant lr, so that both runs step alike). The file has upstream's layout (issue 47):
    weights and two moment slots per tensor, 4 + 12 n bytes of state, which upstream's reader
    walks to the weights tinygpt itself loads; the slots hold the optimizer's state (optim_state),
    and the header no tensor. A file of the layout before (weights alone, the state as base64 in
    the header) resumes to the same. Resuming with another optimizer keeps the weights, starts
    that optimizer's state fresh and says so in one line."""
    common = ["--preset", "tiny", "--quiet", "--sample-tokens", "0", "--eval-every", "0", "--schedule", "constant",
              "--lr", "2e-3"]
    for opt in ("lion", "muon"):
        run_cli("train", *common, "--optimizer", opt, "--steps", "6", "--out", f"{opt}6.tinygpt", cwd=tmp_path)
        run_cli("train", *common, "--optimizer", opt, "--steps", "3", "--out", f"{opt}3.tinygpt", cwd=tmp_path)
        three = ckpt.load(tmp_path / f"{opt}3.tinygpt")
        old_layout(three, optim_state.read(three, make_settings(opt), param_shapes(three.cfg), "x")[0],
                   tmp_path / f"{opt}3old.tinygpt")
        for name in (f"{opt}3.tinygpt", f"{opt}3old.tinygpt"):
            run_cli("train", "--resume", name, "--steps", "6", "--quiet", "--sample-tokens", "0",
                    "--eval-every", "0", cwd=tmp_path)
            a, b = ckpt.load(tmp_path / f"{opt}6.tinygpt"), ckpt.load(tmp_path / name)
            assert a.step == b.step == 6
            assert all(np.array_equal(a.params[n], b.params[n]) for n in a.params), name
            assert all(np.array_equal(a.m[n], b.m[n]) and np.array_equal(a.v[n], b.v[n]) for n in a.params), name
            assert a.extra["optimizer"] == b.extra["optimizer"] and a.extra["optimizer"]["steps"] == 6
        raw = (tmp_path / f"{opt}6.tinygpt").read_bytes()
        hlen = int.from_bytes(raw[8:12], "little")
        header = json.loads(raw[12:12 + hlen])
        n = sum(int(np.prod(s)) for _, s, _ in param_shapes(a.cfg))
        assert header["includesOptimizerState"] is True and header["stateByteLength"] == 4 + 12 * n
        assert len(raw) == 12 + hlen + 4 + 12 * n and "tensors" not in header["tinygptPy"]["optimizer"]
        w, m, v = upstream_read(raw)
        names = {ckpt.upstream_name(p)[0]: p for p in a.params}
        assert all(np.array_equal(w[u], ckpt.load(tmp_path / f"{opt}6.tinygpt").params[p].reshape(w[u].shape))
                   for u, p in names.items())
        state = optim_state.read(a, make_settings(opt), param_shapes(a.cfg), "x")[0]
        first = state[STATE_ROWS[opt][0]]
        for u, p in names.items():     # the m slot is the optimizer's mean of the gradient; v is AdamW-sized
            assert np.array_equal(m[u], first[p].reshape(m[u].shape)), u
            kept = opt == "muon" and not is_muon_matrix(p)
            assert kept or np.array_equal(v[u], np.square(m[u])), u
        print(f"{opt}: {len(raw):,} bytes, header {hlen:,} (was base64 state in the header before)")
        assert hlen < 20_000
    done = run_cli("train", "--resume", "lion6.tinygpt", "--optimizer", "muon", "--steps", "7", "--out", "x.tinygpt",
                   "--quiet", "--sample-tokens", "0", "--eval-every", "0", cwd=tmp_path)
    said = [line for line in done.stderr.splitlines() if line.startswith("optimizer: the file's state")]
    print(said)
    assert len(said) == 1 and "lion's; muon starts its own fresh at step 6" in said[0]
    x = ckpt.load(tmp_path / "x.tinygpt")
    assert x.extra["optimizer"]["name"] == "muon" and x.extra["optimizer"]["steps"] == 1 and x.extra["momentsFrom"] == 6


@pytest.mark.parametrize("opt", ["adamw", "muon"])
def test_a_damaged_state_is_refused_before_it_is_trained_on(tmp_path, opt):
    """A resumed file's optimizer state is checked before the run trusts it (issue 47): a NaN in a
    moment slot stops the resume in one line naming the tensor, and the file is left as it was."""
    from support import in_process, one_line_error
    f = tmp_path / "a.tinygpt"
    run_cli("train", "--preset", "tiny", "--quiet", "--sample-tokens", "0", "--eval-every", "0", "--optimizer", opt,
            "--steps", "2", "--out", str(f), cwd=tmp_path)
    ck = ckpt.load(f)
    ck.m["h0.Wq"] = ck.m["h0.Wq"].copy()
    ck.m["h0.Wq"][1, 2] = np.nan
    ckpt.save(f, ck)
    before = f.read_bytes()
    rc, err = in_process("train", "--resume", f, "--steps", 4, "--quiet", "--sample-tokens", 0, "--eval-every", 0)
    one_line_error(rc, err, "h0.Wq", "not finite")
    print(err[-1])
    assert f.read_bytes() == before


def old_layout(ck, state: dict, out):
    """ck written as tinygpt wrote a Lion or Muon file before issue 47: the weights alone, the
    state as base64 float32 under tinygptPy.optimizer.tensors (Muon's matrices without v)."""
    import base64
    name = ck.extra["optimizer"]["name"]
    b64 = lambda a: base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode("ascii")
    tensors = {p: {row.split()[-1]: b64(state[row][p]) for row in STATE_ROWS[name]
                   if not (name == "muon" and row.endswith(" v") and is_muon_matrix(p))} for p in ck.params}
    extra = dict(ck.extra, optimizer=dict(ck.extra["optimizer"], tensors=tensors))
    ckpt.save(out, ckpt.Checkpoint(ck.cfg, ck.params, None, None, ck.step, ck.loss_history, extra, ck.header,
                                   adam_moments=False))
    assert ckpt.load(out).m is None


@pytest.mark.parametrize("cap", [1, 2 * 48 * 48, 3 * 48 * 48])
def test_muon_batch_cap_forced_low_steps_alike(gpu, plan, monkeypatch, cap):
    """The cap that cuts a shape's matrices into batches (muon.NS_BATCH_FLOATS, 4 MiB: the
    presets up to large run whole) forced low: one matrix a batch (cap 1), and batches of 2 and 3
    of tiny's eight 48 x 48 matrices (the last one short) while the 48 x 192 ones go alone. Three
    Muon steps give bit for bit the weights and momenta of the uncut batches, and the memory
    budget still equals the allocation (the scratch sized from the same batches)."""
    import tinygpt.model.optimizers.muon as CO
    from tinygpt.core.config import param_shapes
    from tinygpt.model.budget import device_limits, memory_budget
    cfg = preset("tiny")
    s = make_settings("muon")
    params = init_params(cfg)
    whole = Model(gpu, plan, RunSpec(cfg, "online", optimizer=s))
    monkeypatch.setattr(CO, "NS_BATCH_FLOATS", cap)
    cut = Model(gpu, plan, RunSpec(cfg, "online", optimizer=s))
    sizes = [len(names) for _, names in CO.ns_batches(param_shapes(cfg))]
    print(f"cap {cap}: batches of {sizes}")
    assert sizes == {1: [1] * 12, 2 * 48 * 48: [2, 2, 2, 2, 1, 1, 1, 1], 3 * 48 * 48: [3, 3, 2, 1, 1, 1, 1]}[cap]
    for m in (whole, cut):
        m.set_params(params)
        for step in range(3):
            m.step(*batch(cfg, step), 1e-2)
    a, b = whole.get_params(), cut.get_params()
    assert all(np.array_equal(a[n], b[n]) for n in a)
    sa, sb = whole.get_opt_state(), cut.get_opt_state()
    assert all(np.array_equal(sa[r][n], sb[r][n]) for r in sa for n in sa[r])
    from test_memory import allocated
    mem = memory_budget(RunSpec(cfg, "online", optimizer=s), plan, device_limits(gpu), sample=0)
    got = allocated(gpu, monkeypatch, lambda: Model(gpu, plan, RunSpec(cfg, "online", optimizer=s)))
    print(f"cap {cap}: budget {mem.total:,} bytes, model {got:,}")
    assert got == mem.total
