"""The small host API everything else uses: adapter and device, buffers, WGSL
loading, pipelines and bind groups, and one-submit execution.

Conventions every shader follows (the only contract between WGSL and Python):
  * binding 0 is a `var<uniform>` Params struct of 4-byte scalars (u32/i32/f32),
    packed in declaration order by `pack_uniform`;
  * bindings 1.. are storage buffers, inputs first, then outputs;
  * 1-D grids are folded into (x, y) because a dimension holds at most 65535
    workgroups; shaders rebuild the linear id from `num_workgroups`.
"""
from __future__ import annotations

import importlib
import logging
import os
import re
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..core.errors import TinyGPTError
from .cost import kernel_flops
from .driver_cache import separate_shader_caches

MAX_GROUPS = 65535


# A 16-bit type's element 2i lies in the low half of word i: WGSL's array<f16> lays them out so,
# and bf16 follows the same order.
@dataclass(frozen=True)
class DType:
    """What a tensor's dtype name means, decided here once for the device, the kernels, the numerics
    check and the model: values per 4-byte word, the NumPy type of a word on the host (a 16-bit
    type's words are packed, element 2i in the low half of word i), and the kernels' constants
    that say a binding holds it: `flag` for the attention kernels (BF16 / F16). `products`: the
    section of products.wgsl that completes the matmul templates for it (its products' type). The
    other shader files keep its kernels in a section tagged with its name (elementwise.wgsl's
    bf16, decode.wgsl's f16, ...). Its own fast matmuls are device/kernels.py's MATMULS[name]."""
    name: str
    per_word: int
    word: type
    flag: str | None = None
    products: str = "f32"

    @property
    def packed(self) -> bool:
        """Two values a word: a 16-bit float, stored beside its float32 master values."""
        return self.per_word == 2


DTYPES = {d.name: d for d in (DType("f32", 1, np.float32), DType("u32", 1, np.uint32), DType("i32", 1, np.int32),
                              DType("bf16", 2, np.uint32, "BF16"),
                              DType("f16", 2, np.uint32, "F16", "f16"))}
PER_WORD = {n: d.per_word for n, d in DTYPES.items()}       # the model's tables read this one field
HALVES = tuple(n for n, d in DTYPES.items() if d.packed)


class GPUError(TinyGPTError, RuntimeError):
    """A failure of the WebGPU layer that a user can act on."""


class NoAdapterError(GPUError):
    pass


class ShaderError(GPUError):
    pass


class LimitError(GPUError):
    pass


def shader_dir() -> Path:
    here = Path(__file__).resolve().parent.parent                # the tinygpt package
    for cand in (here / "shaders", here.parent / "shaders"):  # wheel, checkout
        if (cand / "matmul.wgsl").exists():
            return cand
    raise GPUError(f"WGSL shaders not found next to {here}; reinstall tinygpt")


def _quiet_wgpu_logs(wgpu):
    # wgpu-native logs adapter probing noise (XDG_RUNTIME_DIR etc.) at warning level. After the
    # import: wgpu installs its own logger class, and asserts it finds it, on first import.
    logging.getLogger(wgpu.__name__).setLevel(logging.ERROR)


# The WebGPU implementations this host runs on: the same Python API (wgpu-py's) over
# wgpu-native (naga compiles the WGSL) or over Dawn, Chrome's engine (Tint compiles it, with
# WGSL's uniformity analysis and Chrome's validation). TINYGPT_WEBGPU picks one; wgpu is the default.
ENGINES = {"wgpu": ("wgpu", "wgpu"), "dawn": ("wgpudawn", "wgpudawn")}   # name -> (module, pip package)
ENGINE_LABELS = {"wgpu": "wgpu-native", "dawn": "Dawn"}


def engine_name() -> str:
    name = (os.environ.get("TINYGPT_WEBGPU") or "wgpu").strip().lower()
    if name not in ENGINES:
        raise GPUError(f"unknown WebGPU engine {name!r} in TINYGPT_WEBGPU; choose {' or '.join(ENGINES)}")
    return name


def load_engine(name: str | None = None):
    """The wgpu-py API module of an engine: `wgpu`, or `wgpudawn` (an optional extra)."""
    name = name or engine_name()
    module, package = ENGINES[name]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise GPUError(f"TINYGPT_WEBGPU={name} needs the {package} package, which is not installed here "
                       f"({e}); install it with: pip install 'tinygpt[{name}]'") from e


# SwiftShader, Chrome's CPU Vulkan driver, as Debian's chromium-common installs it
SWIFTSHADER_ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"

# Optional features under each engine's spelling (wgpu-py 0.32 says "subgroup", Dawn "subgroups")
SUBGROUPS = ("subgroup", "subgroups")


_BACKENDS = {"vulkan": "Vulkan", "metal": "Metal", "d3d12": "D3D12", "gl": "OpenGL", "opengl": "OpenGL"}


def pick_adapter(backend: str | None = None, wgpu=None):
    """Vulkan/Metal/D3D12 before OpenGL, real GPUs before CPUs; TINYGPT_BACKEND forces one."""
    wgpu = wgpu or load_engine()
    _quiet_wgpu_logs(wgpu)
    backend = (backend or os.environ.get("TINYGPT_BACKEND") or "").strip().lower()
    if backend and backend not in _BACKENDS:
        raise GPUError(f"unknown backend {backend!r}; TINYGPT_BACKEND takes one of vulkan, metal, d3d12, gl")
    separate_shader_caches()      # before any driver starts: Mesa reads its cache folder once
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # no driver library at all
        raise NoAdapterError(f"WebGPU could not enumerate adapters ({e})") from e
    if backend:
        adapters = [a for a in adapters if a.info.get("backend_type", "") == _BACKENDS[backend]]
    if not adapters:
        where = f" for backend {backend!r}" if backend else ""
        if wgpu.__name__ == "wgpudawn":   # Dawn refuses lavapipe 22.3; SwiftShader serves
            raise NoAdapterError(
                f"Dawn found no WebGPU adapter{where}: install a GPU driver, or on Debian/Ubuntu the CPU one "
                f"with 'apt-get install chromium-common' and set VK_ICD_FILENAMES={SWIFTSHADER_ICD}")
        raise NoAdapterError(
            f"no WebGPU adapter found{where}: install a GPU driver, or on Debian/Ubuntu "
            "the CPU one with 'apt-get install mesa-vulkan-drivers'")
    kind_rank = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
    def rank(a):
        # ties (lavapipe and SwiftShader are both CPU Vulkan) go to the larger workgroups
        info = a.info
        return (info.get("backend_type") == "OpenGL", kind_rank.get(info.get("adapter_type"), 4),
                -int(a.limits.get("max-compute-invocations-per-workgroup", 0)))
    return sorted(adapters, key=rank)[0]


@dataclass
class Tensor:
    """A typed view of (part of) a GPU buffer, row-major. dtype "f32", "u32" or "i32": shape counts
    elements; "bf16" and "f16": two 16-bit values to each 32-bit word (element 2i in the low half
    of word i), and shape counts the words."""
    buf: object
    offset: int  # bytes
    shape: tuple
    dtype: str = "f32"
    name: str = ""

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return 4 * self.size

    def binding(self):
        # Bindings must be a multiple of 4 bytes and non-empty.
        return {"buffer": self.buf, "offset": self.offset, "size": max(4, self.nbytes)}




@dataclass
class Kernel:
    name: str  # entry point
    file: str
    pipeline: object
    layout: object  # bind group layout
    access: str  # one char per binding: u(niform) r(ead) w(rite)
    constants: tuple = ()  # ((override, value), ...) it was built with
    fill: object = None          # a template's completion: "f32"|"f16" (shaders/products.wgsl's products) or a Fill

    @property
    def tags(self) -> frozenset:
        """The sections of its file it was built with (Fill.tags; a product type is its own)."""
        return frozenset({self.fill}) if isinstance(self.fill, str) else self.fill.tags if self.fill else frozenset()

    @property
    def products(self) -> str | None:
        """A matmul template's product type ("f32", "f16": the section of products.wgsl it was
        completed with); None for a kernel that is not completed with products."""
        if isinstance(self.fill, str):
            return self.fill
        if self.fill and self.fill.shown == f"shaders/{PRODUCTS}":
            return "f16" if "f16" in self.fill.tags else "f32"
        return None


@dataclass
class Dispatch:
    kernel: Kernel
    bind_group: object
    grid: tuple
    uniform_buffer: object = None  # kept alive with its bind group
    nbytes: int = 0        # bytes of its storage bindings: the least traffic it could have (profile)
    flops: float | None = None   # its matrix products' FLOPs, where it has any (cost.kernel_flops)
    entries: tuple = ()    # (buffer, offset, size) of each binding, the uniform first (device/trace.py)
    dtypes: frozenset = frozenset()   # the dtypes of the tensors it binds (the numerics check's question)


@dataclass
class Counters:
    buffers: int = 0
    bind_groups: int = 0
    pipelines: int = 0
    submits: int = 0
    readbacks: int = 0


def pack_uniform(values) -> bytes:
    """Python ints become u32 (i32 if negative), floats f32, padded to 16 bytes."""
    out = bytearray()
    for v in values:
        if isinstance(v, (bool, np.bool_)):
            out += struct.pack("<I", int(v))
        elif isinstance(v, (int, np.integer)):
            out += struct.pack("<i" if v < 0 else "<I", int(v))
        else:
            out += struct.pack("<f", float(v))
    out += b"\0" * (-len(out) % 16 or (16 if not out else 0))
    return bytes(out)


def buffer_bytes(nbytes: int) -> int:
    """What GPU.buffer allocates for nbytes: at least 16, rounded up to 16 (the memory budget counts these)."""
    return max(16, (int(nbytes) + 15) // 16 * 16)


def grid1d(n_groups: int) -> tuple:
    """Fold n workgroups into (x, y, 1) within the per-dimension limit."""
    n_groups = max(1, int(n_groups))
    if n_groups <= MAX_GROUPS:
        return (n_groups, 1, 1)
    y = -(-n_groups // MAX_GROUPS)
    return (-(-n_groups // y), y, 1)


class GPU:
    """One adapter, one device, the caches and the counters."""

    def __init__(self, backend: str | None = None):
        self.engine = engine_name()
        self.wgpu = wgpu = load_engine(self.engine)
        self.adapter = pick_adapter(backend, wgpu)
        info = self.adapter.info
        self.backend = info.get("backend_type", "?")
        self.name = info.get("device", "") or self.adapter.summary
        feats = set(self.adapter.features)
        # subgroup: the sg kernels' broadcasts (planner.py checks them before the plan uses them);
        # TINYGPT_NO_SUBGROUPS=1 leaves the feature off, to test or compare without it
        # shader-f16: WGSL's f16 type, which the f16 precision's kernels use (core.precision)
        optional = ("timestamp-query", "shader-f16") + (() if os.environ.get("TINYGPT_NO_SUBGROUPS") else SUBGROUPS)
        want = [f for f in optional if f in feats]
        lim = self.adapter.limits
        keys = ["max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size",
                "max-compute-invocations-per-workgroup", "max-storage-buffers-per-shader-stage",
                "max-compute-workgroup-size-x", "max-compute-workgroup-size-y"]
        required = {k: lim[k] for k in keys if k in lim}
        # Every limit the adapter offers, not WebGPU's defaults (a GPU's 48-64 KiB of workgroup
        # memory and 1024 invocations size the tiled matmul's tiles, its binding size the chunks);
        # where a driver refuses the whole set, the limits this trainer sizes things from.
        try:
            self.device = self.adapter.request_device_sync(required_features=want, required_limits=dict(lim))
        except Exception:
            self.device = self.adapter.request_device_sync(required_features=want, required_limits=required)
        # one spelling above this layer: "subgroup"
        self.features = {"subgroup" if f in SUBGROUPS else f for f in want}
        self.limits = dict(self.device.limits)
        self.queue = self.device.queue
        self.counters = Counters()
        self._modules = {}
        self._kernels = {}
        self._layouts = {}
        self._dummy = None
        self.uniform_bytes = weakref.WeakKeyDictionary()   # uniform buffer -> its last contents
        # what tuning is cached under: the engine too, as Tint and naga compile the same WGSL differently
        driver = info.get("driver", "") or info.get("description", "")
        self.key = f"{self.name} | {self.backend} | {driver}" + (f" | {self.engine}" if self.engine != "wgpu" else "")

    # ---- limits ------------------------------------------------------------------
    # llvmpipe (lavapipe, and Mesa's GL) silently stops an invocation's loops after
    # 65,535 iterations in total (measured: a 70,000-trip loop ran 65,535 times).
    # Kernels keep their loops under it; loops over rows (B*T) are the ones a user can grow.
    LOOP_CAP = 65535

    @property
    def engine_label(self) -> str:
        return ENGINE_LABELS[self.engine]

    @property
    def is_cpu(self) -> bool:
        return self.adapter.info.get("adapter_type") == "CPU" or "llvmpipe" in self.name.lower()

    def check_loop(self, trips: int, what: str, fix: str = "a smaller {opt:batch} or {opt:ctx}"):
        if self.is_cpu and trips > self.LOOP_CAP:
            raise LimitError(f"{what} is {trips:,}, but this CPU adapter ({self.name}) stops any kernel loop after "
                             f"{self.LOOP_CAP:,} iterations; use {fix}")

    @property
    def max_binding(self) -> int:
        return int(self.limits["max-storage-buffer-binding-size"])

    @property
    def max_buffer(self) -> int:
        return int(self.limits["max-buffer-size"])

    def check_size(self, nbytes: int, what: str, binding: bool = True):
        """Refuse before allocating, naming the tensor, its size and the limit."""
        lim = min(self.max_binding, self.max_buffer) if binding else self.max_buffer
        by_binding = binding and self.max_binding <= self.max_buffer
        name = "max-storage-buffer-binding-size" if by_binding else "max-buffer-size"
        if nbytes > lim:
            raise LimitError(f"{what} needs {nbytes:,} bytes but this adapter allows {lim:,} ({name}); "
                             "use a smaller {opt:batch}, {opt:ctx} or model")

    # ---- buffers -------------------------------------------------------------------
    def buffer(self, nbytes: int, label: str = "", binding: bool = True):
        wgpu = self.wgpu
        nbytes = buffer_bytes(nbytes)
        self.check_size(nbytes, label or "a buffer", binding)
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        buf = self.device.create_buffer(size=nbytes, usage=usage, label=label)
        self.counters.buffers += 1
        return buf

    def tensor(self, shape, dtype="f32", name="", data=None) -> Tensor:
        shape = tuple(int(s) for s in shape)
        t = Tensor(None, 0, shape, dtype, name)
        t.buf = self.buffer(t.nbytes, name)
        if data is not None:
            self.write(t, data)
        return t

    def upload(self, array, name="", dtype: str | None = None) -> Tensor:
        """A new tensor holding `array`; dtypes "bf16" and "f16" take packed words (uint32)."""
        a = np.ascontiguousarray(array)
        named = {np.dtype(np.float32): "f32", np.dtype(np.uint32): "u32", np.dtype(np.int32): "i32"}
        dtype = dtype or named.get(a.dtype)
        if dtype is None:
            a = a.astype(np.float32)
            dtype = "f32"
        return self.tensor(a.shape, dtype, name, a)

    def write(self, t: Tensor, array, offset_elems: int = 0):
        a = np.ascontiguousarray(array, dtype=DTYPES[t.dtype].word)
        if a.size:
            self.queue.write_buffer(t.buf, t.offset + 4 * offset_elems, a.tobytes())

    def read(self, t: Tensor, count: int | None = None, offset_elems: int = 0) -> np.ndarray:
        """A full sync: only for what is shown, saved or tested."""
        n = t.size - offset_elems if count is None else count
        start = t.offset + 4 * offset_elems
        # Copies must be 4-byte aligned in offset and size, which they are.
        data = self.queue.read_buffer(t.buf, start, 4 * n)
        self.counters.readbacks += 1
        a = np.frombuffer(data, dtype=DTYPES[t.dtype].word).copy()
        return a.reshape(t.shape) if count is None and offset_elems == 0 else a

    def dummy(self, access: str = "r", slot: int = 0) -> Tensor:
        """Bound where a kernel's optional binding is absent (flags say so).

        One for reading, and one for writing per binding slot: a buffer may not be written
        through two bindings, nor read and written, in one dispatch."""
        if self._dummy is None:
            self._dummy = {}
        key = "r" if access == "r" else ("w", slot)
        if key not in self._dummy:
            self._dummy[key] = self.tensor((4,), name=f"dummy_{access}{slot}", data=np.zeros(4, np.float32))
        return self._dummy[key]

    # ---- shaders and pipelines -------------------------------------------------------
    def module(self, file: str, fill=None):
        """A shader module from shaders/ (or an absolute path), with common.wgsl put in front of its
        declarations, completed by `fill` (with_prelude); compile errors name the file and line
        they are in."""
        key = (file, fill)
        if key not in self._modules:
            src, where, shown = shader_source(file, self.engine, fill)
            try:
                mod = self.device.create_shader_module(code=src, label=shown)
            except Exception as e:
                raise ShaderError(wgsl_error_line(str(e), where)) from e
            self._modules[key] = mod
        return self._modules[key]

    def bind_layout(self, access: str):
        if access not in self._layouts:
            wgpu = self.wgpu
            types = {"u": wgpu.BufferBindingType.uniform, "r": wgpu.BufferBindingType.read_only_storage,
                     "w": wgpu.BufferBindingType.storage}
            entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": types[c]}}
                       for i, c in enumerate(access)]
            bgl = self.device.create_bind_group_layout(entries=entries)
            self._layouts[access] = (bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]))
        return self._layouts[access]

    def kernel(self, file: str, entry: str, access: str, constants: dict | None = None,
               fill=None) -> Kernel:
        """A pipeline, made once. fill: what completes the file (with_prelude): a matmul template's
        product type ("f32", "f16": shaders/products.wgsl), or a Fill (a width's or a dtype's
        prelude, the sections kept, an optimizer's update)."""
        key = (file, entry, access, tuple(sorted((constants or {}).items())), fill)
        k = self._kernels.get(key)
        if k is None:
            bgl, pl = self.bind_layout(access)
            stage = {"module": self.module(file, fill), "entry_point": entry}
            if constants:
                stage["constants"] = {n: float(v) for n, v in constants.items()}
            try:
                pipe = self.device.create_compute_pipeline(layout=pl, compute=stage, label=entry)
            except Exception as e:
                raise ShaderError(f"cannot build pipeline {entry} from shaders/{file}: {e}") from e
            self.counters.pipelines += 1
            k = self._kernels[key] = Kernel(entry, file, pipe, bgl, access, key[3], fill)
        return k

    def dispatch(self, kernel: Kernel, uniform, tensors, grid) -> Dispatch:
        """Bind once: the returned Dispatch is replayed every step."""
        assert len(tensors) + 1 == len(kernel.access), (kernel.name, len(tensors), kernel.access)
        if isinstance(uniform, (bytes, bytearray)):
            pbytes = bytes(uniform)
        else:
            pbytes = pack_uniform(uniform)
        ubuf = self.device.create_buffer_with_data(
            data=pbytes, usage=self.wgpu.BufferUsage.UNIFORM | self.wgpu.BufferUsage.COPY_DST)
        self.uniform_bytes[ubuf] = pbytes
        self.counters.buffers += 1
        d = self.dispatch_with(kernel, ubuf, tensors, grid)
        d.flops = kernel_flops(kernel.name, uniform)
        return d

    def uniform(self, nbytes: int):
        """A uniform buffer rewritten between steps (learning rate, step count)."""
        buf = self.device.create_buffer(size=max(16, (nbytes + 15) // 16 * 16),
                                        usage=self.wgpu.BufferUsage.UNIFORM | self.wgpu.BufferUsage.COPY_DST)
        self.uniform_bytes[buf] = bytes(buf.size)
        self.counters.buffers += 1
        return buf

    def write_uniform(self, buf, data: bytes):
        """Rewrite a uniform buffer; its bytes are kept here too, as a uniform buffer cannot be
        read back and a trace (device/trace.py) records what each dispatch saw."""
        self.queue.write_buffer(buf, 0, data)
        self.uniform_bytes[buf] = bytes(data)

    def dispatch_with(self, kernel: Kernel, ubuf, tensors, grid) -> Dispatch:
        nbytes = sum(t.binding()["size"] for t in tensors if t is not None)
        tensors = [t if t is not None else self.dummy(c, i) for i, (t, c) in enumerate(zip(tensors, kernel.access[1:]))]
        entries = [{"binding": 0, "resource": {"buffer": ubuf, "offset": 0, "size": ubuf.size}}]
        entries += [{"binding": i + 1, "resource": t.binding()} for i, t in enumerate(tensors)]
        bg = self.device.create_bind_group(layout=kernel.layout, entries=entries)
        bound = tuple((e["resource"]["buffer"], e["resource"]["offset"], e["resource"]["size"]) for e in entries)
        self.counters.bind_groups += 1
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if max(grid) > MAX_GROUPS:
            raise LimitError(f"{kernel.name}: grid {grid} exceeds {MAX_GROUPS} workgroups per dimension")
        return Dispatch(kernel, bg, grid, ubuf, nbytes, entries=bound,
                        dtypes=frozenset(t.dtype for t in tensors if not t.name.startswith("dummy")))

    # ---- execution -------------------------------------------------------------------
    def run(self, dispatches, timestamps=None):
        """Encode every dispatch into one compute pass and submit once.

        With `timestamps` (Timestamps), each dispatch gets its own pass with
        begin/end timestamp writes instead, so that its GPU time can be read.
        """
        try:
            enc = self.device.create_command_encoder()
            if timestamps is None:
                cp = enc.begin_compute_pass()
                for d in dispatches:
                    cp.set_pipeline(d.kernel.pipeline)
                    cp.set_bind_group(0, d.bind_group)
                    cp.dispatch_workgroups(*d.grid)
                cp.end()
            else:
                timestamps.encode(enc, dispatches)
            self.queue.submit([enc.finish()])
        except Exception as e:
            raise self.explain(e, dispatches) from e
        self.counters.submits += 1

    def explain(self, e: Exception, dispatches) -> GPUError:
        """A wgpu failure as one GPUError line: what kind, and which kernel where known."""
        msg = str(e)
        kind = type(e).__name__
        lost = "lost" in msg.lower() or "Lost" in kind
        names = [d.kernel.name for d in dispatches]
        named = [n for n in dict.fromkeys(names) if f"'{n}'" in msg]
        listed = ", ".join(dict.fromkeys(names[:4])) + (", ..." if len(names) > 4 else "")
        where = f"in kernel {named[0]}" if named else f"in a submission of {len(names)} dispatches ({listed})"
        first = next((l.strip() for l in msg.splitlines() if l.strip() and "Caused by" not in l), kind)
        sort = kind.replace("GPU", "").replace("Error", "").lower() or "validation"
        what = "the GPU device was lost" if lost else f"GPU {sort} error"
        return GPUError(f"{what} {where}: {first}")

    def sync(self):
        """Wait for submitted work (a 16-byte readback: wgpu 0.32's work-done callback is broken)."""
        self.queue.read_buffer(self.dummy("r").buf, 0, 16)


class Timestamps:
    """GPU time per dispatch from timestamp queries (one pass per dispatch)."""

    def __init__(self, gpu: GPU, n: int):
        if "timestamp-query" not in gpu.features:
            raise GPUError("this adapter offers no timestamp queries")
        wgpu = gpu.wgpu
        self.gpu, self.n = gpu, n
        self.qs = gpu.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
        self.buf = gpu.device.create_buffer(size=16 * n,
                                            usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)

    def encode(self, enc, dispatches):
        assert len(dispatches) <= self.n
        for i, d in enumerate(dispatches):
            cp = enc.begin_compute_pass(timestamp_writes={
                "query_set": self.qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
            cp.set_pipeline(d.kernel.pipeline)
            cp.set_bind_group(0, d.bind_group)
            cp.dispatch_workgroups(*d.grid)
            cp.end()
        enc.resolve_query_set(self.qs, 0, 2 * len(dispatches), self.buf, 0)

    def read_ms(self, count: int) -> np.ndarray:
        raw = np.frombuffer(self.gpu.queue.read_buffer(self.buf, 0, 16 * count), dtype=np.uint64).reshape(count, 2)
        return (raw[:, 1].astype(np.int64) - raw[:, 0].astype(np.int64)).clip(min=0) / 1e6


PRELUDE = "common.wgsl"
PRODUCTS = "products.wgsl"


def _split_enables(text: str) -> tuple:
    """-> (its leading lines up to the last `enable` directive, the rest), as lists of lines."""
    lines = text.splitlines(keepends=True)
    head = max((i + 1 for i, l in enumerate(lines) if re.match(r"\s*enable\s", l)), default=0)
    return lines[:head], lines[head:]


class Fill(NamedTuple):
    """What completes a shader file, from outside it. text: WGSL put in after common.wgsl (a
    width's aliases, an optimizer's update; its `enable` directives join the file's at the top);
    `shown` names it in compile errors, and it keys the pipeline. names: the file's {{KEY}}
    placeholders and what each becomes (an entry point's name), one line each. tags: the
    sections (`//#if TAG` .. `//#else` .. `//#endif`) kept: the code a feature the adapter may
    lack needs (subgroups, f16), in the same file as the rest of its op family."""
    shown: str
    text: str = ""
    names: tuple = ()
    tags: frozenset = frozenset()


def products(kind: str, *tags: str) -> Fill:
    """What completes a matmul template: shaders/products.wgsl with the section of its product type
    ("f32", "f16": DType.products) kept, and those of `tags` in the template ("sg": subgroups)."""
    return Fill(f"shaders/{PRODUCTS}", (shader_dir() / PRODUCTS).read_text(), (), frozenset((kind,) + tags))


def sections(text: str, tags, shown: str) -> str:
    """text with its `//#if TAG` sections resolved: a section's lines (and the directives) become
    empty lines where it is not kept, so that compile errors keep their line numbers. One level,
    `//#else` optional; a TAG that starts with ! is kept where the tag is absent."""
    out, keep, open_at = [], True, None
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        m = re.match(r"\s*//#(if|else|endif)\b\s*(!?\w*)", line)
        if m and m[1] == "if":
            if open_at is not None:
                raise ValueError(f"{shown}:{n}: a //#if inside the //#if of line {open_at}")
            open_at, keep = n, (m[2].lstrip("!") in tags) != m[2].startswith("!")
        elif m and open_at is None:
            raise ValueError(f"{shown}:{n}: //#{m[1]} without its //#if")
        elif m:
            keep, open_at = (not keep, open_at) if m[1] == "else" else (True, None)
        out.append(line if keep and not m else "\n" if line.endswith("\n") else "")
    if open_at is not None:
        raise ValueError(f"{shown}:{open_at}: //#if without its //#endif")
    return "".join(out)


def with_prelude(src: str, shown: str, fill=None):
    """-> (source with shaders/common.wgsl inserted after its leading `enable` directives and
    completed by `fill`, where(line) -> (file, line) of a line of the combined source).
    fill: a matmul template's product type ("f32", "f16"): shaders/products.wgsl with that
    section kept goes in after the common file, its `enable` directives joining the source's at
    the top; or a Fill (its text goes in the same way, its names and tags apply to the source).
    common.wgsl's f16 and sg sections are kept where the combined source enables f16, subgroups."""
    if shown.endswith(PRELUDE):
        return src, lambda n: (shown, n)
    if isinstance(fill, str):
        fill = products(fill)
    for key, value in fill.names if fill else ():
        src = src.replace("{{" + key + "}}", value)
    tags = fill.tags if fill else frozenset()
    head, body = _split_enables(sections(src, tags, shown))
    fill_head, fill_body = [], []
    if fill:
        fill_head, fill_body = _split_enables(sections(fill.text, tags, fill.shown) + "\n")
        fill_head, fill_body = [(fill.shown, 1, fill_head)], [(fill.shown, len(fill_head) + 1, fill_body)]
    enables = head + [l for _, _, ls in fill_head for l in ls]
    enabled = frozenset(t for t, ext in (("f16", "f16"), ("sg", "subgroups"))
                        if any(re.match(rf"\s*enable\s+{ext}\s*;", l) for l in enables))
    common = (sections((shader_dir() / PRELUDE).read_text(), enabled, PRELUDE) + "\n").splitlines(keepends=True)
    # each segment: (file shown, its first line's number in that file, its lines)
    segments = [(shown, 1, head)] + fill_head + [(f"shaders/{PRELUDE}", 1, common)] + fill_body + \
        [(shown, len(head) + 1, body)]
    combined = "".join(l for _, _, ls in segments for l in ls)

    def where(n: int):
        for name, first, ls in segments:
            if n <= len(ls):
                return name, first + n - 1
            n -= len(ls)
        return shown, len(head) + len(body)
    return combined, where


def shader_source(file: str, engine: str, fill=None):
    """-> (the WGSL an engine compiles for a file of shaders/ or an absolute path: the prelude in,
    adapted by for_engine; where(line) -> (file, line); the name shown in errors). fill: what
    completes it (with_prelude)."""
    path = Path(file) if Path(file).is_absolute() else shader_dir() / file
    shown = file if Path(file).is_absolute() else f"shaders/{file}"
    src, where = with_prelude(path.read_text(), shown, fill)
    return for_engine(src, engine), where, shown


def for_engine(src: str, engine: str) -> str:
    """The WGSL as an engine's compiler takes it. The shaders are standard WGSL, so those that
    use subgroup builtins begin `enable subgroups;`, which Tint and browsers require; naga
    (wgpu 0.32) refuses the directive and takes the builtins without it, so for wgpu it becomes a
    comment of the same line (error line numbers unchanged)."""
    if engine == "wgpu":
        src = re.sub(r"(?m)^(\s*)enable subgroups;", r"\1// enable subgroups; (naga: implied)", src)
    return src


def wgsl_error_line(msg: str, where) -> str:
    """naga's or Tint's multi-line report as one line: 'WGSL error at FILE:LINE:COL: what (note)'.
    where: the file shown, or where(line) -> (file, line) for a source with the prelude."""
    if isinstance(where, str):
        where = (lambda shown: lambda n: (shown, n))(where)
    lines = [l.strip() for l in msg.splitlines() if l.strip()]
    tint = next((m.groups() for l in lines if (m := re.search(r"(?:^|\s)\S*?:(\d+):(\d+) error: (.*)", l))), None)
    if tint:                                    # Tint: ':LINE:COL error: what'
        f, n = where(int(tint[0]))
        return f"WGSL error at {f}:{n}:{tint[1]}: {tint[2]}"
    pos = next((m.groups() for l in lines if (m := re.search(r"┌─\s*\S*?:(\d+):(\d+)", l))), None)
    if pos:
        f, n = where(int(pos[0]))
        where_text = f"{f}:{n}:{pos[1]}"
    else:
        where_text = where(0)[0]
    what = next((l for l in lines if l.startswith("Shader ")), lines[-1] if lines else "invalid shader")
    note = next((l.lstrip("= ").strip() for l in lines if l.startswith("=")), "")
    return f"WGSL error at {where_text}: {what}" + (f" ({note})" if note else "")
