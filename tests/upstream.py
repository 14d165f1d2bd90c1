"""The .tinygpt file as upstream's readers see it, written from upstream's published format (its field
names, types and layouts, as facts: ../shared/design/TINYGPT.md), not from our writer, so a file that
passes upstream_problems is one upstream's browser playground, python_ref/load_tinygpt.py and Mac app
can read; and files built byte by byte in upstream's layout, the same way."""
import json
import math
import struct
from datetime import datetime

import numpy as np

from tinygpt.core.config import Config
from tinygpt.files import checkpoint as ckpt


# ---- upstream's format, as facts --------------------------------------------------------------
def upstream_manifest(L, C, ctx, d_mlp, V):
    """(name, PyTorch-style shape, shape of the stored bytes) in storage order."""
    rows = [("token_embedding.weight", [V, C]), ("position_embedding.weight", [ctx, C]),
            ("ln_final.weight", [C]), ("ln_final.bias", [C])]
    for i in range(L):
        b = f"blocks.{i}."
        rows += [(b + "ln1.weight", [C]), (b + "ln1.bias", [C])]
        for p in "qkvo":
            rows += [(b + f"attn.{p}_proj.weight", [C, C]), (b + f"attn.{p}_proj.bias", [C])]
        rows += [(b + "ln2.weight", [C]), (b + "ln2.bias", [C]), (b + "mlp.fc_in.weight", [d_mlp, C]),
                 (b + "mlp.fc_in.bias", [d_mlp]), (b + "mlp.fc_out.weight", [C, d_mlp]), (b + "mlp.fc_out.bias", [C])]
    # the bytes are [in, out]: a linear weight's stored shape is its PyTorch shape reversed
    return [(n, s, s[::-1] if n.endswith("_proj.weight") or ".mlp.fc_" in n and n.endswith("weight") else s)
            for n, s in rows]


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def upstream_problems(raw: bytes) -> list[str]:
    """What upstream's readers would trip on in a file's bytes; [] when none."""
    bad = []
    if raw[:4] != b"TGPT" or struct.unpack("<I", raw[4:8])[0] != 2:
        return ["not TGPT version 2"]
    n = struct.unpack("<I", raw[8:12])[0]
    h = json.loads(raw[12:12 + n])
    state = len(raw) - 12 - n
    c = h.get("config", {})
    for k in ("layers", "dModel", "ctx", "heads", "dMlp", "batchSize", "seed"):
        if not is_int(c.get(k)):
            bad.append(f"config.{k} {c.get(k)!r}")
    for k in ("learningRate", "gradClip"):
        if not is_num(c.get(k)):
            bad.append(f"config.{k} {c.get(k)!r}")
    V = c.get("vocabSize", 256)
    if (V != 256) != ("tokenizerSource" in c):
        bad.append("vocabSize and tokenizerSource go together, for non-byte vocabularies only")
    try:
        datetime.fromisoformat(h["savedAt"].replace("Z", "+00:00"))
    except (KeyError, AttributeError, ValueError):
        bad.append(f"savedAt {h.get('savedAt')!r}")
    want = upstream_manifest(c["layers"], c["dModel"], c["ctx"], c["dMlp"], V)
    off, names = 0, []
    for e, (name, shape, _) in zip(h.get("manifest", []), want):
        if e.get("name") != name or e.get("shape") != shape or e.get("floatOffset") != off:
            bad.append(f"manifest entry {e} (upstream: {name} {shape} at {off})")
        off += math.prod(shape)
        names.append(e.get("name"))
    if len(h.get("manifest", [])) != len(want):
        bad.append(f"manifest of {len(h.get('manifest', []))} entries, upstream has {len(want)}")
    dtype, opt = h.get("weightDtype"), h.get("includesOptimizerState")
    need = {("fp32", True): 4 + 12 * off, ("fp32", False): 4 + 4 * off, ("fp16", False): 4 + 2 * off}.get((dtype, opt))
    if need is None or need != state or h.get("stateByteLength") != state:
        bad.append(f"{dtype} optimizer state {opt}: {state} bytes of state, stateByteLength "
                   f"{h.get('stateByteLength')}, the layout needs {need}")
    for p in h.get("lossHistory", []):
        if not (is_int(p.get("step")) and is_num(p.get("train")) and (p.get("val") is None or is_num(p["val"]))):
            bad.append(f"lossHistory point {p}")
    fl = h.get("finalLoss")
    if fl is not None and not (isinstance(fl, dict) and is_int(fl.get("step")) and is_num(fl.get("train"))
                               and (fl.get("val") is None or is_num(fl["val"]))):
        bad.append(f"finalLoss {fl!r} (upstream calls finalLoss.train.toFixed)")
    bv = h.get("bestVal")
    if bv is not None and not (isinstance(bv, dict) and is_num(bv.get("loss")) and is_int(bv.get("step"))):
        bad.append(f"bestVal {bv!r}")
    if not isinstance(h.get("sample", ""), str):
        bad.append(f"sample {h.get('sample')!r}")
    return bad


def header_of(raw: bytes) -> dict:
    return json.loads(raw[12:12 + struct.unpack("<I", raw[8:12])[0]])


def stored_weights(cfg: Config, params: dict) -> list[np.ndarray]:
    """Each tensor in manifest order as the bytes hold it ([in, out]), flattened."""
    return [np.asarray(params[name], np.float32).reshape(-1) for name, _, _ in ckpt.param_shapes(cfg)]


def upstream_file(cfg: Config, header: dict, state: bytes) -> bytes:
    """A .tinygpt as upstream's writers lay it out, with the manifest from the facts above."""
    man, off = [], 0
    for name, shape, _ in upstream_manifest(cfg.layers, cfg.d_model, cfg.ctx, cfg.d_mlp, cfg.vocab):
        man.append({"name": name, "shape": shape, "floatOffset": off})
        off += math.prod(shape)
    header = dict({"version": 2, "savedAt": "2026-05-01T10:00:00.000Z",
                   "config": {"layers": cfg.layers, "dModel": cfg.d_model, "ctx": cfg.ctx, "heads": cfg.heads,
                              "dMlp": cfg.d_mlp, "batchSize": cfg.batch, "learningRate": 3e-4, "gradClip": 1.0,
                              "seed": 7, "backend": "wasm", "maxSteps": 500},
                   "manifest": man, "stateByteLength": len(state)}, **header)
    hb = json.dumps(header).encode()
    return b"TGPT" + struct.pack("<II", 2, len(hb)) + hb + state


def with_config(raw: bytes, **fields) -> bytes:
    """The same file with fields set in its header's config (the state untouched)."""
    h = header_of(raw)
    h["config"].update(fields)
    hb = json.dumps(h).encode()
    return b"TGPT" + struct.pack("<II", 2, len(hb)) + hb + raw[12 + struct.unpack("<I", raw[8:12])[0]:]


def fp16_state(cfg, params, step=0):
    return struct.pack("<i", step) + b"".join(w.astype("<f2").tobytes() for w in stored_weights(cfg, params))
