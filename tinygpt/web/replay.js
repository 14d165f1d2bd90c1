// Replays a tinygpt trace (tinygpt/device/trace.py) with the browser's own WebGPU: the same
// WGSL, pipelines, buffers, bindings and workgroup counts as the Python host submitted, in one
// compute pass, then reads back the views the trace names. Plain JavaScript, no framework;
// tinygpt/web/browser.py loads this page in headless Chromium and calls window.tinygpt.

const fromB64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));

function toB64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

// The limits our kernels are sized from: the adapter's own, asked for in full (as the Python
// host does), so that the device allows what the plan was made for.
const LIMITS = ["maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupStorageSize",
  "minStorageBufferOffsetAlignment", "minUniformBufferOffsetAlignment",
  "maxComputeInvocationsPerWorkgroup", "maxStorageBuffersPerShaderStage", "maxComputeWorkgroupSizeX",
  "maxComputeWorkgroupSizeY", "maxComputeWorkgroupSizeZ", "maxComputeWorkgroupsPerDimension"];

let cached = null;

async function device() {
  if (cached) return cached;
  if (!navigator.gpu) throw new Error("this browser exposes no WebGPU (navigator.gpu is missing)");
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Error("the browser's WebGPU found no adapter");
  const requiredLimits = {};
  for (const k of LIMITS) requiredLimits[k] = adapter.limits[k];
  const requiredFeatures = ["subgroups", "timestamp-query", "shader-f16"].filter((f) => adapter.features.has(f));
  const dev = await adapter.requestDevice({ requiredLimits, requiredFeatures });
  const info = adapter.info || {};
  cached = { adapter, dev, info: { vendor: info.vendor, architecture: info.architecture,
    device: info.device, description: info.description },
    features: requiredFeatures, limits: requiredLimits };
  return cached;
}

async function describe() {
  const { info, features, limits } = await device();
  return { info, features, limits, userAgent: navigator.userAgent };
}

function layoutFor(dev, layouts, access) {
  if (!layouts.has(access)) {
    const type = { u: "uniform", r: "read-only-storage", w: "storage" };
    const bgl = dev.createBindGroupLayout({ entries: [...access].map((c, i) => (
      { binding: i, visibility: GPUShaderStage.COMPUTE, buffer: { type: type[c] } })) });
    layouts.set(access, { bgl, layout: dev.createPipelineLayout({ bindGroupLayouts: [bgl] }) });
  }
  return layouts.get(access);
}

// Every module and pipeline of a trace: the compiler's messages for each module, and the error,
// if any, of each pipeline's creation. Nothing runs.
async function build(dev, trace) {
  const messages = [];
  const modules = [];
  for (const m of trace.modules) {
    const mod = dev.createShaderModule({ code: m.code, label: m.name });
    const info = await mod.getCompilationInfo();
    for (const msg of info.messages) {
      messages.push({ module: m.name, type: msg.type, line: msg.lineNum, col: msg.linePos, text: msg.message });
    }
    modules.push(mod);
  }
  const layouts = new Map();
  const pipelines = [];
  const errors = [];
  for (const p of trace.pipelines) {
    const { bgl, layout } = layoutFor(dev, layouts, p.access);
    const stage = { module: modules[p.module], entryPoint: p.entry };
    if (Object.keys(p.constants).length) stage.constants = p.constants;
    try {
      pipelines.push({ bgl, pipe: await dev.createComputePipelineAsync({ layout, compute: stage, label: p.entry }) });
    } catch (e) {
      errors.push({ module: trace.modules[p.module].name, entry: p.entry, constants: p.constants, text: String(e.message || e) });
      pipelines.push(null);
    }
  }
  return { messages, errors, pipelines };
}

async function compile(trace) {
  const { dev } = await device();
  const { messages, errors } = await build(dev, trace);
  return { messages, errors, modules: trace.modules.length, pipelines: trace.pipelines.length };
}

function makeBuffer(dev, row, usage) {
  const buf = dev.createBuffer({ size: row.size, usage, mappedAtCreation: true });
  new Uint8Array(buf.getMappedRange()).set(fromB64(row.data));
  buf.unmap();
  return buf;
}

async function replay(trace) {
  const { dev } = await device();
  const { messages, errors, pipelines } = await build(dev, trace);
  if (errors.length) return { messages, errors };
  dev.pushErrorScope("validation");
  const U = GPUBufferUsage;
  const storage = trace.buffers.map((b) => makeBuffer(dev, b, U.STORAGE | U.COPY_SRC | U.COPY_DST));
  const uniforms = trace.uniforms.map((b) => makeBuffer(dev, b, U.UNIFORM | U.COPY_DST));
  const enc = dev.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (const d of trace.dispatches) {
    const { bgl, pipe } = pipelines[d.pipeline];
    const [ui, uoff, usize] = d.uniform;
    const entries = [{ binding: 0, resource: { buffer: uniforms[ui], offset: uoff, size: usize } }];
    d.storage.forEach(([bi, off, size], i) => entries.push({ binding: i + 1, resource: { buffer: storage[bi], offset: off, size } }));
    pass.setPipeline(pipe);
    pass.setBindGroup(0, dev.createBindGroup({ layout: bgl, entries }));
    pass.dispatchWorkgroups(...d.grid);
  }
  pass.end();
  const reads = {};
  for (const [name, [bi, off, size]] of Object.entries(trace.outputs)) {
    const rb = dev.createBuffer({ size, usage: U.COPY_DST | U.MAP_READ });
    enc.copyBufferToBuffer(storage[bi], off, rb, 0, size);
    reads[name] = rb;
  }
  const t0 = performance.now();
  dev.queue.submit([enc.finish()]);
  const outputs = {};
  for (const [name, rb] of Object.entries(reads)) {
    await rb.mapAsync(GPUMapMode.READ);
    outputs[name] = toB64(new Uint8Array(rb.getMappedRange()));
    rb.unmap();
  }
  const ms = performance.now() - t0;
  const err = await dev.popErrorScope();
  if (err) errors.push({ module: "", entry: "", constants: {}, text: err.message });
  return { messages, errors, outputs, ms };
}

window.tinygpt = { describe, compile, replay };
document.getElementById("status").textContent = "ready";
