"""The kernel plan as data: which variant of each kernel family runs, and the sizes that the
device's limits allow.

A plan is made once per device (planner.make_plan: the subgroup check, the tuning cache, the
kernels option), is immutable, and is handed to the launchers (kernels.Kernels), which every
model, attention and decoder object takes from its caller. PORTABLE needs no optional feature:
tests and tools ask for it by name. Within a family the shape can still demand a fallback (the
vec4 and sg matmuls need N and K multiples of 4): the plan says what is preferred, the launcher
what fits.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.errors import UsageError

# family -> its variants, preferred first
FAMILIES = {
    "matmul": ("sg", "tiled", "vec4", "scalar"),   # matmul_vec4.wgsl's sg section, matmul_tiled, matmul_vec4, matmul
    "attention": ("sg", "tiles"),              # online attention: online_sg.wgsl, online.wgsl
    "loss": ("sg", "scalar"),                  # cross-entropy: loss.wgsl's cross_entropy_sg, cross_entropy
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
    few_rows: int = 4                      # products of at most this many rows: matmul_rows (0: none)
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
        d.update(matmul_wx=self.matmul_wx, matmul_tile=list(self.matmul_tile), few_rows=self.few_rows,
                 online_block=list(self.online_block) if self.online_block else None,
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


def tile_problem(limits: dict, tile) -> str | None:
    """Why matmul_tiled.wgsl cannot run with tile (WX, WY, TM, TV, BK) under a device's limits, or None."""
    wx, wy, tm, tv, bk = tile
    if not (1 <= tm <= 8 and 1 <= tv <= 2 and bk % 4 == 0 and bk > 0 and (wy * tm) % 4 == 0):
        return f"tile {tile}: TM 1-8, TV 1-2, BK and WY*TM multiples of 4"
    if wx * wy > int(limits.get("max-compute-invocations-per-workgroup", 256)):
        most = limits.get("max-compute-invocations-per-workgroup")
        return f"{wx * wy} invocations per workgroup, over the device's {most}"
    if wx > int(limits.get("max-compute-workgroup-size-x", 256)) \
            or wy > int(limits.get("max-compute-workgroup-size-y", 256)):
        return f"workgroup {wx} x {wy} over the device's size limits"
    shared = 4 * bk * (wy * tm + 4 * wx * tv)
    if shared > int(limits.get("max-compute-workgroup-storage-size", 16384)):
        most = limits.get("max-compute-workgroup-storage-size")
        return f"{shared:,} bytes of workgroup memory, over the device's {most:,}"
    return None


def _online_shared_bytes(hd: int, bk: int) -> int:
    """online.wgsl's workgroup memory: two [BK, hd] tiles (hd padded to HD4 vec4) and BK of L and D."""
    return (2 * bk * 4 * (-(-hd // 32) * 8) + 2 * bk) * 4


def online_fits(limits: dict, hd: int, bq: int, bk: int) -> bool:
    inv = int(limits.get("max-compute-invocations-per-workgroup", 256))
    return bq <= inv and bk <= min(inv, 64) and \
        _online_shared_bytes(hd, bk) <= int(limits.get("max-compute-workgroup-storage-size", 16384))


def online_tiles(limits: dict, plan: KernelPlan, hd: int, T: int | None = None) -> tuple[int, int]:
    """(BQ, BK) of online.wgsl: BK key rows whose two tiles fit workgroup memory, at most 32; BQ
    query rows share each tile: 128 (the fastest of 32, 64 and 128 on lavapipe: docs/results.md)
    or the plan's online_block. Neither exceeds T rounded up to a power of two: at T = 64 a
    128-row workgroup would leave half its lanes idle."""
    tuned = plan.online_block
    if tuned and online_fits(limits, hd, *tuned):
        bq, bk = tuned
    else:
        bk = 32
        while bk > 1 and _online_shared_bytes(hd, bk) > int(limits.get("max-compute-workgroup-storage-size", 16384)):
            bk //= 2
        bq = min(128, int(limits.get("max-compute-invocations-per-workgroup", 256)))
    if T:
        p2 = 1 << max(0, int(T) - 1).bit_length()
        bq, bk = min(bq, p2), min(bk, p2)
    return int(bq), int(bk)
