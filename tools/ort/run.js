#!/usr/bin/env node
// Run an ONNX model in ONNX Runtime (CPU execution provider): the independent oracle
// against which Teq's executor and Teq's exported models are checked, and the
// baseline of the CPU benchmark.
//
//   node tools/ort/run.js MODEL.onnx --input NAME=FILE ... [--shape NAME=1x3x224x224]
//        [--repeat N] [--threads N] [--output-dir DIR] [--quiet]
//
// FILE ending in .pb is an ONNX TensorProto (float32 or int64, dims taken from it);
// any other FILE is raw little-endian data of the input's type (float32 or int64) whose
// shape comes from the session's input metadata, or from --shape where the metadata has
// symbolic dimensions. Every model input must be given.
// Prints one line per output "output NAME SHAPE sum=S abs_sum=A", then "load_ms L"
// (session creation) and "time_ms M (median of N runs[, after 1 warm-up])"; with
// --repeat N it first runs once to warm up, then times N runs. --output-dir writes
// output_J.bin, J in the session's output order, as raw little-endian float32 (other
// numeric outputs are converted).
// --threads sets ONNX Runtime's intra-op thread count (default: its own choice).
// Exit status: 0 ok, 2 bad arguments or input files, 1 ONNX Runtime failure.
// Set up once with:  cd tools/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci

'use strict';

const fs = require('fs');
const path = require('path');

function usage(msg) {
  if (msg) process.stderr.write(`run.js: ${msg}\n`);
  process.stderr.write('usage: node tools/ort/run.js MODEL.onnx --input NAME=FILE ... ' +
    '[--shape NAME=AxBxC] [--repeat N] [--threads N] [--output-dir DIR] [--quiet]\n');
  process.exit(msg ? 2 : 0);
}

// A bad input file or model (not a bad command line): message only, exit 2.
function die(msg) {
  process.stderr.write(`run.js: ${msg}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const a = { model: null, inputs: new Map(), shapes: new Map(), repeat: 0, threads: 0,
              outputDir: null, quiet: false };
  const needValue = (i, flag) => {
    if (i + 1 >= argv.length) usage(`${flag} needs a value`);
    return argv[i + 1];
  };
  const splitPair = (s, flag) => {
    const eq = s.indexOf('=');
    if (eq <= 0 || eq === s.length - 1) usage(`${flag} expects NAME=VALUE, got '${s}'`);
    return [s.slice(0, eq), s.slice(eq + 1)];
  };
  const posInt = (s, flag, min) => {
    if (!/^\d+$/.test(s) || Number(s) < min) usage(`${flag} expects an integer >= ${min}, got '${s}'`);
    return Number(s);
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--input') { const [n, f] = splitPair(needValue(i, arg), arg); a.inputs.set(n, f); i++; }
    else if (arg === '--shape') {
      const [n, s] = splitPair(needValue(i, arg), arg);
      if (!/^\d+(x\d+)*$/.test(s)) usage(`--shape ${n}: expected dims like 1x3x224x224, got '${s}'`);
      a.shapes.set(n, s.split('x').map(Number)); i++;
    }
    else if (arg === '--repeat') { a.repeat = posInt(needValue(i, arg), arg, 0); i++; }
    else if (arg === '--threads') { a.threads = posInt(needValue(i, arg), arg, 1); i++; }
    else if (arg === '--output-dir') { a.outputDir = needValue(i, arg); i++; }
    else if (arg === '--quiet') a.quiet = true;
    else if (arg === '-h' || arg === '--help') usage();
    else if (arg.startsWith('-')) usage(`unknown option ${arg}`);
    else if (a.model === null) a.model = arg;
    else usage(`more than one model given ('${a.model}', '${arg}')`);
  }
  if (a.model === null) usage('no model given');
  return a;
}

// --- A minimal reader of onnx.TensorProto (dims=1, data_type=2, float_data=4,
// int64_data=7, name=8, raw_data=9), enough for the tensors our tools write.
const ONNX_FLOAT = 1, ONNX_INT64 = 7;

function readTensorProto(buf, file) {
  let pos = 0;
  const fail = (what) => { throw new Error(`${file}: not a valid TensorProto (${what} at byte ${pos})`); };
  const varint = () => {
    let v = 0, mul = 1;
    for (let k = 0; k < 10; k++) {
      if (pos >= buf.length) fail('truncated varint');
      const b = buf[pos++];
      v += (b & 0x7f) * mul;
      if (!(b & 0x80)) return v;
      mul *= 128;
    }
    fail('varint too long');
  };
  // int64 values as BigInt (two's complement for negatives).
  const varintBig = () => {
    let v = 0n, shift = 0n;
    for (let k = 0; k < 10; k++) {
      if (pos >= buf.length) fail('truncated varint');
      const b = BigInt(buf[pos++]);
      v |= (b & 0x7fn) << shift;
      if (!(b & 0x80n)) return BigInt.asIntN(64, v);
      shift += 7n;
    }
    fail('varint too long');
  };
  const t = { dims: [], dataType: 0, name: '', floats: [], int64s: [], raw: null };
  while (pos < buf.length) {
    const key = varint();
    const field = Math.floor(key / 8), wire = key % 8;
    if (wire === 2) {
      const len = varint();
      if (pos + len > buf.length) fail('truncated field');
      const end = pos + len;
      if (field === 1) { while (pos < end) t.dims.push(varint()); }
      else if (field === 4) {
        if (len % 4) fail('float_data length');
        for (; pos < end; pos += 4) t.floats.push(buf.readFloatLE(pos));
      }
      else if (field === 7) { while (pos < end) t.int64s.push(varintBig()); }
      else if (field === 8) t.name = buf.toString('utf8', pos, end);
      else if (field === 9) t.raw = buf.subarray(pos, end);
      pos = end;
    } else if (wire === 0) {
      if (field === 1) t.dims.push(varint());
      else if (field === 2) t.dataType = varint();
      else if (field === 7) t.int64s.push(varintBig());
      else varint();
    } else if (wire === 5) {
      if (pos + 4 > buf.length) fail('truncated fixed32');
      if (field === 4) t.floats.push(buf.readFloatLE(pos));
      pos += 4;
    } else if (wire === 1) {
      if (pos + 8 > buf.length) fail('truncated fixed64');
      pos += 8;
    } else fail(`unsupported wire type ${wire}`);
  }
  const count = t.dims.reduce((x, y) => x * y, 1);
  let data;
  if (t.dataType === ONNX_FLOAT) {
    if (t.raw) {
      if (t.raw.length !== count * 4) throw new Error(`${file}: raw_data has ${t.raw.length} bytes, dims need ${count * 4}`);
      data = new Float32Array(count);
      for (let k = 0; k < count; k++) data[k] = t.raw.readFloatLE(4 * k);
    } else {
      if (t.floats.length !== count) throw new Error(`${file}: ${t.floats.length} floats, dims need ${count}`);
      data = Float32Array.from(t.floats);
    }
    return { type: 'float32', dims: t.dims, data };
  }
  if (t.dataType === ONNX_INT64) {
    if (t.raw) {
      if (t.raw.length !== count * 8) throw new Error(`${file}: raw_data has ${t.raw.length} bytes, dims need ${count * 8}`);
      data = new BigInt64Array(count);
      for (let k = 0; k < count; k++) data[k] = t.raw.readBigInt64LE(8 * k);
    } else {
      if (t.int64s.length !== count) throw new Error(`${file}: ${t.int64s.length} int64s, dims need ${count}`);
      data = BigInt64Array.from(t.int64s);
    }
    return { type: 'int64', dims: t.dims, data };
  }
  throw new Error(`${file}: TensorProto data_type ${t.dataType} not supported (float32=1, int64=7)`);
}

function readRaw(buf, file, type, dims) {
  const count = dims.reduce((x, y) => x * y, 1);
  const width = type === 'int64' ? 8 : 4;
  if (buf.length !== count * width) {
    throw new Error(`${file}: ${buf.length} bytes, but ${type} of shape ${dims.join('x')} needs ${count * width}`);
  }
  if (type === 'int64') {
    const d = new BigInt64Array(count);
    for (let k = 0; k < count; k++) d[k] = buf.readBigInt64LE(8 * k);
    return d;
  }
  const d = new Float32Array(count);
  for (let k = 0; k < count; k++) d[k] = buf.readFloatLE(4 * k);
  return d;
}

function median(xs) {
  const s = [...xs].sort((x, y) => x - y);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

function toFloat32(data) {
  if (data instanceof Float32Array) return data;
  const out = new Float32Array(data.length);
  for (let k = 0; k < data.length; k++) out[k] = Number(data[k]);
  return out;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  // ONNX Runtime leaves an empty mat-debug-PID.log in $TMPDIR (else /tmp) from every
  // process: it gets a directory of its own, removed when this one exits.
  const own = fs.mkdtempSync(path.join(require('os').tmpdir(), 'teq-ort-'));
  process.env.TMPDIR = own;
  process.on('exit', () => fs.rmSync(own, { recursive: true, force: true }));
  let ort;
  try {
    ort = require('onnxruntime-node');
  } catch (e) {
    process.stderr.write(`run.js: onnxruntime-node is not installed (${e.message.split('\n')[0]}); ` +
      `run: cd ${path.relative(process.cwd(), __dirname) || '.'} && ONNXRUNTIME_NODE_INSTALL=skip npm ci\n`);
    process.exit(3);
  }
  if (!fs.existsSync(args.model)) die(`${args.model}: no such file`);

  const options = { executionProviders: ['cpu'] };
  if (args.threads) options.intraOpNumThreads = args.threads;
  let session;
  const tLoad = process.hrtime.bigint();
  try {
    session = await ort.InferenceSession.create(args.model, options);
  } catch (e) {
    process.stderr.write(`run.js: ${args.model}: ONNX Runtime could not load the model: ${e.message}\n`);
    process.exit(2);
  }

  const loadMs = Number(process.hrtime.bigint() - tLoad) / 1e6;
  const feeds = {};
  const meta = session.inputMetadata || [];
  for (const name of session.inputNames) {
    const file = args.inputs.get(name);
    if (file === undefined) die(`${args.model}: no --input for model input '${name}' (inputs: ${session.inputNames.join(', ')})`);
    const m = meta.find((x) => x.name === name) || {};
    let buf;
    try { buf = fs.readFileSync(file); } catch (e) { die(`${file}: ${e.message}`); }
    try {
      if (file.endsWith('.pb')) {
        const t = readTensorProto(buf, file);
        feeds[name] = new ort.Tensor(t.type, t.data, t.dims);
      } else {
        const type = m.type === 'int64' ? 'int64' : 'float32';
        let dims = args.shapes.get(name);
        if (!dims) {
          const shape = m.shape || [];
          if (shape.some((d) => typeof d !== 'number' || d < 0)) {
            die(`input '${name}' has symbolic shape [${shape.join(', ')}]; pass --shape ${name}=AxBx...`);
          }
          dims = shape.slice();
        }
        feeds[name] = new ort.Tensor(type, readRaw(buf, file, type, dims), dims);
      }
    } catch (e) {
      die(e.message);
    }
  }
  for (const name of args.inputs.keys()) {
    if (!session.inputNames.includes(name)) die(`${args.model}: model has no input '${name}' (inputs: ${session.inputNames.join(', ')})`);
  }

  let results;
  const times = [];
  const runOnce = async () => {
    const t0 = process.hrtime.bigint();
    results = await session.run(feeds);
    return Number(process.hrtime.bigint() - t0) / 1e6;
  };
  try {
    if (args.repeat > 0) {
      await runOnce(); // warm-up: first run allocates and plans
      for (let r = 0; r < args.repeat; r++) times.push(await runOnce());
    } else {
      times.push(await runOnce());
    }
  } catch (e) {
    process.stderr.write(`run.js: ${args.model}: run failed: ${e.message}\n`);
    process.exit(1);
  }

  if (args.outputDir) fs.mkdirSync(args.outputDir, { recursive: true });
  session.outputNames.forEach((name, j) => {
    const t = results[name];
    const f = toFloat32(t.data);
    let sum = 0, abs = 0;
    for (let k = 0; k < f.length; k++) { sum += f[k]; abs += Math.abs(f[k]); }
    if (!args.quiet) {
      console.log(`output ${name} ${t.dims.length ? t.dims.join('x') : 'scalar'} ` +
        `sum=${sum.toPrecision(9)} abs_sum=${abs.toPrecision(9)}`);
    }
    if (args.outputDir) {
      const out = Buffer.alloc(f.length * 4);
      for (let k = 0; k < f.length; k++) out.writeFloatLE(f[k], 4 * k);
      fs.writeFileSync(path.join(args.outputDir, `output_${j}.bin`), out);
    }
  });
  const note = args.repeat > 0 ? `median of ${times.length} runs, after 1 warm-up` : '1 run, no warm-up';
  console.log(`load_ms ${loadMs.toFixed(3)} (session creation: parse, optimize, plan)`);
  console.log(`time_ms ${median(times).toFixed(3)} (${note})`);
}

main().catch((e) => {
  process.stderr.write(`run.js: ${e.stack || e}\n`);
  process.exit(1);
});
