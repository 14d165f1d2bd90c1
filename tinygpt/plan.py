"""The kernel plan: which variant of each kernel family runs, decided once per device.

A plan is made from what the adapter can do (the subgroup check), the tuning
cache `tinygpt tune` writes, and explicit overrides (the kernels option: matmul=vec4);
it is immutable and passed to the model, attention and launchers. A launcher
given no plan uses PORTABLE, which needs no optional feature. Within a family
the shape can still demand a fallback (the vec4 and sg matmuls need N and K
multiples of 4): the plan says what is preferred, the launcher what fits.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

from .errors import UsageError

# family -> its variants, preferred first
FAMILIES = {
    "matmul": ("sg", "tiled", "vec4", "scalar"),   # matmul_sg.wgsl, matmul_tiled.wgsl, matmul_vec4.wgsl, matmul.wgsl
    "attention": ("sg", "tiles"),              # online attention: online_sg.wgsl, online.wgsl
    "loss": ("sg", "scalar"),                  # cross-entropy: loss_sg.wgsl, loss.wgsl
    "reduce": ("sg", "scalar"),                # column sums: bias and LayerNorm gain/bias gradients
    "elementwise": ("vec4", "scalar"),         # GELU, add, LayerNorm rows, gradient norm, AdamW
    "decode": ("cache", "full"),               # sampling: decode.wgsl from a key/value cache, or the whole window
}


@dataclass(frozen=True)
class KernelPlan:
    matmul: str = "vec4"
    attention: str = "tiles"
    loss: str = "scalar"
    reduce: str = "scalar"
    elementwise: str = "vec4"
    decode: str = "cache"
    matmul_wx: int = 8                     # lanes per workgroup of the vec4 matmuls (x 4 columns)
    matmul_tile: tuple = (16, 16, 4, 1, 16)  # (WX, WY, TM, TV, BK) of the tiled matmuls: a 64 x 64 tile
    online_block: tuple | None = None      # (BQ, BK) of online.wgsl; None: sized from the device limits
    loop_cap: int | None = None            # llvmpipe stops any kernel loop after this many trips
    sources: tuple = ()                    # ((family, "default" | "tuned" | "forced"), ...)
    subgroups: str = "not checked"         # "ok", or why the sg variants cannot run

    def variant(self, family: str) -> str:
        return getattr(self, family)

    def describe(self) -> str:
        """One line: every family's choice, where it came from, and the tunables."""
        src = dict(self.sources)
        fams = " ".join(f"{f}={self.variant(f)}" + (f"({src[f]})" if src.get(f, "default") != "default" else "")
                        for f in FAMILIES)
        block = "x".join(map(str, self.online_block)) if self.online_block else "auto"
        tile = "x".join(map(str, self.matmul_tile))
        return (f"{fams}; matmul_wx={self.matmul_wx} matmul_tile={tile} online_block={block}; "
                f"subgroups {self.subgroups}")

    def as_dict(self) -> dict:
        d = {f: self.variant(f) for f in FAMILIES}
        d.update(matmul_wx=self.matmul_wx, matmul_tile=list(self.matmul_tile), online_block=list(self.online_block) if self.online_block else None,
                 subgroups=self.subgroups, sources=dict(self.sources))
        return d

    def with_(self, **kw) -> "KernelPlan":
        return replace(self, **kw)


PORTABLE = KernelPlan()


def parse_kernels(text: str | None) -> dict:
    """'matmul=vec4,attention=tiles' -> {'matmul': 'vec4', 'attention': 'tiles'}; a one-line error
    listing the valid families and variants otherwise."""
    out = {}
    valid = "; ".join(f"{f}={'|'.join(v)}" for f, v in FAMILIES.items())
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        fam, eq, var = part.partition("=")
        fam, var = fam.strip(), var.strip()
        if not eq or fam not in FAMILIES:
            raise UsageError(f"unknown family {fam!r} in {part!r}; valid: {valid}")
        if var not in FAMILIES[fam]:
            raise UsageError(f"{fam} has no variant {var!r}; choose {'|'.join(FAMILIES[fam])}")
        out[fam] = var
    return out


_SG_VERDICT = weakref.WeakKeyDictionary()   # device -> "ok" or why not: a check, asked once per device


def subgroup_verdict(gpu) -> str:
    if gpu not in _SG_VERDICT:
        from . import kernels as K
        if "subgroup" not in gpu.features:
            _SG_VERDICT[gpu] = "unavailable (the adapter lacks the subgroup feature, or TINYGPT_NO_SUBGROUPS is set)"
        else:
            _SG_VERDICT[gpu] = K.check_subgroups(gpu)
    return _SG_VERDICT[gpu]


# the tuning cache's keys (older caches wrote *_variant)
_TUNED = {"matmul": ("matmul", "matmul_variant"), "attention": ("attention", "online_variant")}


def make_plan(gpu, overrides: dict | None = None, tuning: dict | None = None) -> KernelPlan:
    """The plan for this device: defaults, then the tuning cache, then the overrides.

    Defaults: the sg variants on CPU adapters, where they measured fastest (README), when the
    subgroup check passes; elsewhere tiled matmuls and vec4 / tiles / scalar for the rest, until
    `tinygpt tune` measures something faster."""
    from .gpu import read_tuning
    overrides = dict(overrides or {})
    tuning = read_tuning(gpu.key) if tuning is None else tuning
    sg = subgroup_verdict(gpu)
    # On a GPU, untuned, the matmuls take the tiled family: workgroup-memory tiles with register
    # blocks are how every fast GPU matmul is built (TinyGPT's went 47.2 -> 17.2 -> 9.1 ms at 2048^3
    # on an M-series GPU with tiles, then register blocks); on a CPU adapter they are the slowest
    # (README), so vec4 there. Not measured on a GPU here: `tinygpt tune` settles it per adapter.
    fallback = {"matmul": "vec4" if gpu.is_cpu else "tiled", "attention": "tiles", "loss": "scalar",
                "reduce": "scalar", "elementwise": "vec4", "decode": "cache"}
    chosen, sources = {}, []
    for fam in FAMILIES:
        var, src = fallback[fam], "default"
        if "sg" in FAMILIES[fam] and sg == "ok" and gpu.is_cpu:
            var = "sg"
        for key in _TUNED.get(fam, ()):
            if key in tuning and (tuning[key] != "sg" or sg == "ok"):
                var, src = tuning[key], "tuned"
                break
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
    from .kernels import tile_problem
    why = tile_problem(gpu, tile)
    if why:
        if chosen["matmul"] == "tiled" and dict(sources)["matmul"] == "forced":
            raise UsageError(f"{{opt:kernels}} matmul=tiled cannot run here: {why}")
        if chosen["matmul"] == "tiled":          # the device's limits refuse the tile: fall back
            chosen["matmul"] = "vec4"
    return KernelPlan(**chosen, matmul_wx=int(tuning.get("matmul_wx", 8)), matmul_tile=tile,
                      online_block=tuple(block) if block else None,
                      loop_cap=gpu.LOOP_CAP if gpu.is_cpu else None, sources=tuple(sources), subgroups=sg)
