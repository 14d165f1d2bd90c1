"""Making the kernel plan of a device: the subgroup check, then defaults, the tuning cache and
the kernels option, in that order. The application calls make_plan once per device and hands
the plan down; nothing below it makes one.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..core.errors import UsageError
from .gpu import GPU
from .kernels import Kernels
from .plan import FAMILIES, PORTABLE, KernelPlan, tile_problem
from .tuning import read_tuning

_SG_VERDICT = weakref.WeakKeyDictionary()   # device -> "ok" or why not: a check, asked once per device


def check_subgroups(gpu: GPU) -> str:
    """"ok" if matmul_vec4.wgsl's sg kernels' lane indexing holds on this device (subgroups of 8 or more lanes
    holding a workgroup), else why not: all three kernels against NumPy at ragged shapes."""
    M, N, Kd = 60, 60, 12  # 32-row tiles, 2 column blocks, the last of each partly past M and N
    r = np.random.default_rng(7)
    a, b, bias = r.standard_normal((M, Kd)), r.standard_normal((Kd, N)), r.standard_normal(N)
    at, bt = r.standard_normal((Kd + 1, M)), r.standard_normal((Kd + 1, N))  # odd K for A^T @ B
    up = lambda x: gpu.upload(x.astype(np.float32))
    out = gpu.tensor((M, N))
    kn = Kernels(gpu, PORTABLE)
    try:
        for d, want in ((kn.matmul(up(a), up(b), up(bias), out, M, N, Kd, variant="sg"), a @ b + bias),
                        (kn.matmul_abt(up(a), up(b.T), out, M, N, Kd, variant="sg"), a @ b),
                        (kn.matmul_atb(up(at), up(bt), out, M, N, Kd + 1, variant="sg"), at.T @ bt)):
            gpu.run([d])
            if not np.allclose(gpu.read(out), want, rtol=1e-4, atol=1e-4):
                return f"unusable (the sg matmul {d.kernel.name} disagrees with NumPy on this device)"
    except Exception as e:  # a compiler that refuses the kernels counts as no
        return f"unusable (the sg kernels do not build here: {str(e).splitlines()[0][:120]})"
    return "ok"


def subgroup_verdict(gpu: GPU) -> str:
    """"ok", or why the sg variants cannot run on this device; checked once per device."""
    if gpu not in _SG_VERDICT:
        if "subgroup" not in gpu.features:
            _SG_VERDICT[gpu] = "unavailable (the adapter lacks the subgroup feature, or TINYGPT_NO_SUBGROUPS is set)"
        else:
            _SG_VERDICT[gpu] = check_subgroups(gpu)
    return _SG_VERDICT[gpu]


def subgroups_ok(gpu: GPU) -> bool:
    return subgroup_verdict(gpu) == "ok"


def make_plan(gpu: GPU, overrides: dict | None = None, tuning: dict | None = None) -> KernelPlan:
    """The plan for this device: defaults, then the tuning cache, then the overrides.

    Defaults: the sg variants on CPU adapters, where they measured fastest (docs/results.md),
    when the subgroup check passes. Elsewhere, untuned, the matmuls take the tiled family:
    workgroup-memory tiles with register blocks are how every fast GPU matmul is built (TinyGPT's
    own GPU matmul is; docs/kernels.md), while on a CPU adapter they are the slowest, so vec4
    there; vec4 / tiles / scalar for the rest, until `tinygpt tune` measures something faster."""
    overrides = dict(overrides or {})
    tuning = read_tuning(gpu.key) if tuning is None else tuning
    sg = subgroup_verdict(gpu)
    fallback = {"matmul": "vec4" if gpu.is_cpu else "tiled", "attention": "tiles", "loss": "scalar",
                "reduce": "scalar", "elementwise": "vec4", "decode": "cache"}
    chosen, sources = {}, []
    for fam in FAMILIES:
        var, src = fallback[fam], "default"
        if "sg" in FAMILIES[fam] and sg == "ok" and gpu.is_cpu:
            var = "sg"
        if fam in tuning and (tuning[fam] != "sg" or sg == "ok"):    # tune writes matmul and attention
            var, src = tuning[fam], "tuned"
        if fam in overrides:
            var, src = overrides.pop(fam), "forced"
            if var == "sg" and sg != "ok":
                raise UsageError(f"{{opt:kernels}} {fam}=sg needs working subgroups, and here they are {sg}; "
                                 f"choose {'|'.join(v for v in FAMILIES[fam] if v != 'sg')}")
        chosen[fam] = var
        sources.append((fam, src))
    if overrides:
        raise UsageError(f"{{opt:kernels}}: unknown families {', '.join(overrides)}; valid: {', '.join(FAMILIES)}")
    block = tuning.get("online_block")
    tile = tuple(tuning.get("matmul_tile") or KernelPlan.matmul_tile)
    why = tile_problem(gpu.limits, tile)
    if why and chosen["matmul"] == "tiled":
        if dict(sources)["matmul"] == "forced":
            raise UsageError(f"{{opt:kernels}} matmul=tiled cannot run here: {why}")
        chosen["matmul"] = "vec4"                 # the device's limits refuse the tile: fall back
    return KernelPlan(**chosen, matmul_wx=int(tuning.get("matmul_wx", 8)), matmul_tile=tile,
                      online_block=tuple(block) if block else None,
                      loop_cap=gpu.LOOP_CAP if gpu.is_cpu else None, sources=tuple(sources), subgroups=sg)
