// The model bundle: config, vocabularies and every weight of a run folder in one JSON object
// (written by glassformer/lab/bundle.py). The weights are little-endian float32 or float16 bytes in one
// base64 string; each tensor names its shape and its byte range. Everything is read into Float64Array:
// the engine computes in float64, as the lesson does.

export const BUNDLE_FORMAT = "glassformer-bundle/1";
export const MAX_BUNDLE_DATA_CHARS = 1 << 30;       // base64 characters of the weights (768 MiB of bytes)
export const MAX_BUNDLE_TENSORS = 10000;            // tensors in one bundle
export const MAX_TENSOR_RANK = 4;                   // axes of one tensor
const BYTES = { float32: 4, float16: 2 };

function damaged(detail) {
  return new Error(`model bundle: ${detail} (the file is damaged or not a glassformer model bundle)`);
}

const BASE64 = (() => {
  const table = new Int16Array(128).fill(-1);
  const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (let i = 0; i < letters.length; i++) table[letters.charCodeAt(i)] = i;
  return table;
})();

// base64 text -> bytes, four characters to three bytes, without an intermediate binary string; any character
// outside the alphabet is an error
export function decodeBase64(text) {
  let end = text.length;
  while (end > 0 && text.charCodeAt(end - 1) === 61) end--;          // "=" padding
  if (text.length % 4 !== 0 || text.length - end > 2) throw damaged("the weights are not base64 text");
  const bytes = new Uint8Array(Math.floor((end * 3) / 4));
  const sextet = (i) => {
    const c = text.charCodeAt(i);
    const v = c < 128 ? BASE64[c] : -1;
    if (v < 0) throw damaged(`the weights are not base64 text (character ${i})`);
    return v;
  };
  const whole = end - (end % 4);
  let out = 0;
  for (let i = 0; i < whole; i += 4) {
    const n = (sextet(i) << 18) | (sextet(i + 1) << 12) | (sextet(i + 2) << 6) | sextet(i + 3);
    bytes[out++] = n >> 16;
    bytes[out++] = (n >> 8) & 0xff;
    bytes[out++] = n & 0xff;
  }
  if (end % 4 >= 2) {                                                  // the last two or three characters
    const n = (sextet(whole) << 18) | (sextet(whole + 1) << 12) | (end % 4 === 3 ? sextet(whole + 2) << 6 : 0);
    bytes[out++] = n >> 16;
    if (end % 4 === 3) bytes[out++] = (n >> 8) & 0xff;
  } else if (end % 4 === 1) {
    throw damaged("the weights are not base64 text");
  }
  return bytes;
}

// IEEE half precision -> number
export function halfToNumber(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * fraction * 2 ** -24;               // subnormal
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}

let HALVES = null;                                                     // every half's value, built once

const LITTLE_ENDIAN = new Uint8Array(Uint16Array.of(1).buffer)[0] === 1;

// `count` little-endian float32 / float16 numbers at byte `offset` -> Float64Array
function decodeTensor(bytes, offset, count, dtype) {
  const width = BYTES[dtype], at = bytes.byteOffset + offset;
  const aligned = LITTLE_ENDIAN && at % width === 0;
  const source = aligned ? bytes.buffer : bytes.slice(offset, offset + count * width).buffer;
  const start = aligned ? at : 0;
  if (!LITTLE_ENDIAN) {                                                // a big-endian machine reads byte by byte
    const view = new DataView(source, start, count * width);
    return Float64Array.from({ length: count }, (_, i) =>
      (dtype === "float32" ? view.getFloat32(4 * i, true) : halfToNumber(view.getUint16(2 * i, true))));
  }
  if (dtype === "float32") return Float64Array.from(new Float32Array(source, start, count));
  if (!HALVES) HALVES = Float64Array.from({ length: 65536 }, (_, h) => halfToNumber(h));
  const halves = new Uint16Array(source, start, count), data = new Float64Array(count);
  for (let i = 0; i < count; i++) data[i] = HALVES[halves[i]];
  return data;
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

// Every field and size checked before anything is allocated: one Error line naming what is wrong
function checkHeader(bundle) {
  if (!isObject(bundle)) throw damaged("expected a JSON object");
  if (bundle.format !== BUNDLE_FORMAT) {
    throw damaged(`format: expected "${BUNDLE_FORMAT}", got ${JSON.stringify(String(bundle.format)).slice(0, 60)}`);
  }
  if (!isObject(bundle.config)) throw damaged("config: expected an object of model settings");
  if (!isObject(bundle.vocab)) throw damaged("vocab: expected {source, target}");
  if (!(bundle.dtype in BYTES)) throw damaged(`dtype: expected float32 or float16, got ${String(bundle.dtype).slice(0, 40)}`);
  if (typeof bundle.data !== "string") throw damaged("data: expected a base64 string");
  if (bundle.data.length > MAX_BUNDLE_DATA_CHARS) {
    throw damaged(`data: ${bundle.data.length} characters, over the limit of ${MAX_BUNDLE_DATA_CHARS}`);
  }
  if (!isObject(bundle.tensors)) throw damaged("tensors: expected an object name -> {shape, offset, length}");
  const names = Object.keys(bundle.tensors);
  if (names.length === 0 || names.length > MAX_BUNDLE_TENSORS) {
    throw damaged(`tensors: ${names.length} entries (1..${MAX_BUNDLE_TENSORS} expected)`);
  }
  const size = Math.floor((bundle.data.replace(/=+$/, "").length * 3) / 4);   // bytes the data decodes to
  for (const name of names) {
    const t = bundle.tensors[name];
    if (!isObject(t) || !Array.isArray(t.shape) || t.shape.length > MAX_TENSOR_RANK) {
      throw damaged(`tensor ${name}: expected {shape, offset, length}`);
    }
    let count = 1;
    for (const n of t.shape) {
      if (!Number.isSafeInteger(n) || n < 0) throw damaged(`tensor ${name}: shape ${JSON.stringify(t.shape)}`);
      count *= n;
    }
    if (!Number.isSafeInteger(t.offset) || !Number.isSafeInteger(t.length) || t.offset < 0 ||
        t.length !== count * BYTES[bundle.dtype] || t.offset + t.length > size) {
      throw damaged(`tensor ${name}: bytes ${t.offset}..${t.offset + t.length} of shape ` +
                    `${JSON.stringify(t.shape)} do not fit the ${size} bytes of data`);
    }
  }
}

// The parsed bundle JSON -> {config, vocab, dtype, tensors: Map name -> {shape, data: Float64Array}}
export function loadBundle(bundle) {
  checkHeader(bundle);
  const bytes = decodeBase64(bundle.data);
  const tensors = new Map();
  for (const [name, t] of Object.entries(bundle.tensors)) {
    const count = t.length / BYTES[bundle.dtype];
    const data = decodeTensor(bytes, t.offset, count, bundle.dtype);
    for (let i = 0; i < count; i++) {
      if (!Number.isFinite(data[i])) throw damaged(`tensor ${name}: a non-finite weight at entry ${i}`);
    }
    tensors.set(name, { shape: t.shape.slice(), data });
  }
  return { config: bundle.config, vocab: bundle.vocab, dtype: bundle.dtype, tensors };
}
