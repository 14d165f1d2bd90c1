"""One submission as data, for another WebGPU to replay: tinygpt/web/replay.js runs it in a
browser (scripts/browser_step.py, tests/web/test_browser.py).

A trace holds everything the submission depends on and nothing of Python's: each shader module's
WGSL as a browser compiles it (the prelude in, `enable subgroups;` kept), each pipeline's entry
point, bind-group layout and override constants, each storage buffer's size and contents just
before the submission, each uniform buffer's bytes, and each dispatch's bindings (buffer, offset,
size) and workgroup counts, in order. `outputs` names views to read back after it. The buffers'
contents are read after every earlier write is queued, so the replay starts where wgpu did.
"""
from __future__ import annotations

import base64
from contextlib import contextmanager

from .gpu import GPU, Tensor, shader_source

FORMAT = "tinygpt-trace/1"


def _b64(data) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def module_source(file: str, fill=None) -> str:
    """A shader file as a browser's compiler takes it (what GPU.module gives Dawn); fill: what
    completes it (gpu.with_prelude)."""
    return shader_source(file, "browser", fill)[0]


class Recorder:
    """Builds a trace from dispatches; buffers and pipelines are numbered as first met."""

    def __init__(self, gpu: GPU):
        self.gpu = gpu
        self.modules, self.pipelines, self.buffers, self.uniforms, self.dispatches = [], [], [], [], []
        self._ids = {}    # ("m"|"p"|"b"|"u", key) -> index

    def _index(self, kind: str, key, make) -> int:
        k = (kind, key)
        if k not in self._ids:
            table = {"m": self.modules, "p": self.pipelines, "b": self.buffers, "u": self.uniforms}[kind]
            self._ids[k] = len(table)
            table.append(make())
        return self._ids[k]

    def pipeline(self, kernel) -> int:
        src = (kernel.file, kernel.fill)
        m = self._index("m", src, lambda: {"name": kernel.file, "code": module_source(*src)})
        return self._index("p", (src, kernel.name, kernel.access, kernel.constants), lambda: {
            "module": m, "entry": kernel.name, "access": kernel.access,
            "constants": {n: float(v) for n, v in kernel.constants}})

    def buffer(self, buf) -> int:
        # read now: every write queued before this submission is in it
        return self._index("b", id(buf), lambda: {
            "size": int(buf.size), "data": _b64(self.gpu.queue.read_buffer(buf, 0, buf.size)), "_buf": buf})

    def uniform(self, buf) -> int:
        data = self.gpu.uniform_bytes.get(buf)
        if data is None:
            raise ValueError("a dispatch's uniform buffer was not made by this GPU object; it cannot be traced")
        return self._index("u", id(buf), lambda: {"size": int(buf.size), "data": _b64(data), "_buf": buf})

    def add(self, dispatches):
        for d in dispatches:
            (ubuf, uoff, usize), *storage = d.entries
            self.dispatches.append({
                "pipeline": self.pipeline(d.kernel), "grid": list(d.grid),
                "uniform": [self.uniform(ubuf), uoff, usize],
                "storage": [[self.buffer(b), off, size] for b, off, size in storage]})

    def view(self, t: Tensor, count: int | None = None) -> list:
        """[buffer index, byte offset, bytes] of a tensor bound in the trace."""
        key = ("b", id(t.buf))
        if key not in self._ids:
            raise ValueError(f"{t.name or 'the tensor'} is not bound by any dispatch of the trace")
        return [self._ids[key], t.offset, 4 * (t.size if count is None else count)]

    def as_dict(self, outputs: dict) -> dict:
        clean = lambda rows: [{k: v for k, v in r.items() if k != "_buf"} for r in rows]
        return {"format": FORMAT, "modules": self.modules, "pipelines": self.pipelines,
                "buffers": clean(self.buffers), "uniforms": clean(self.uniforms),
                "dispatches": self.dispatches, "outputs": outputs}


@contextmanager
def recording(gpu: GPU):
    """Within it, each gpu.run(...) is recorded (before it runs) into the Recorder yielded.
    Timestamped runs are not traced."""
    rec = Recorder(gpu)
    real = gpu.run

    def run(dispatches, timestamps=None):
        dispatches = list(dispatches)
        rec.add(dispatches)
        return real(dispatches, timestamps)
    gpu.run = run
    try:
        yield rec
    finally:
        del gpu.run      # the class's method again


@contextmanager
def collecting_kernels(gpu: GPU):
    """Within it, the GPU's pipeline cache starts empty: the list yielded holds, on exit, every
    kernel built inside (the cache as it was is restored)."""
    saved, built = dict(gpu._kernels), []
    gpu._kernels.clear()
    try:
        yield built
    finally:
        built.extend(gpu._kernels.values())
        gpu._kernels.clear()
        gpu._kernels.update(saved)
