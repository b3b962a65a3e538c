// glassformer lab: the exported file's weights, written by lab/bundle.py pack_weights: each byte of a weight's
// float in a plane of its own (sign and exponent bytes together), deflated (zlib, with its Adler-32 check), seven
// bits a character. Decoded here with the browser's own DecompressionStream, back into the little-endian float
// bytes of the model bundle; a damaged file is one line "model bundle: ...".
export const PACK_FORMAT = "planes-zlib-text7";
const ESCAPED = [0x00, 0x0d, 0x3c];                  // NUL, CR, "<": written as a two-byte character with the next value
const ESCAPE_BASE = 0x100;

function damaged(detail) {
  return new Error(`model bundle: ${detail} (the file is damaged or not a glassformer model bundle)`);
}

/** The deflated bytes from the text: seven bits a character, most significant first. */
function sevenBits(text, size) {
  const out = new Uint8Array(size);
  let n = 0; let acc = 0; let bits = 0;
  const put = (v) => {
    acc = (acc << 7) | v; bits += 7;
    if (bits >= 8) { bits -= 8; if (n < size) out[n++] = (acc >> bits) & 0xff; acc &= (1 << bits) - 1; }
  };
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) { put(c); continue; }
    const k = (c - ESCAPE_BASE) >> 7;
    if (k < 0 || k >= 2 * ESCAPED.length) throw damaged(`weights: character U+${c.toString(16).toUpperCase().padStart(4, "0")} at ${i}`);
    if (k < ESCAPED.length) { put(ESCAPED[k]); put((c - ESCAPE_BASE) & 0x7f); } else put(ESCAPED[k - ESCAPED.length]);
  }
  if (n !== size) throw damaged(`weights: ${n} of ${size} bytes (cut short?)`);
  return out;
}

/** The float bytes of pack_weights' text; info: {format, width, bytes, deflated}. */
export async function unpackWeights(text, info) {
  if (!info || info.format !== PACK_FORMAT) throw damaged(`packing: expected ${PACK_FORMAT}, got ${String(info && info.format).slice(0, 40)}`);
  const { width, bytes, deflated } = info;
  if (![2, 4].includes(width) || !Number.isSafeInteger(bytes) || bytes % width || !Number.isSafeInteger(deflated)) {
    throw damaged("packing: sizes");
  }
  const packed = sevenBits(text, deflated);
  let planes;
  try {
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("deflate"));
    planes = new Uint8Array(await new Response(stream).arrayBuffer());
  } catch (e) {
    throw damaged(`weights: ${String(e.message || e).split("\n")[0]}`);
  }
  if (planes.length !== bytes) throw damaged(`weights: ${planes.length} bytes, expected ${bytes}`);
  const count = bytes / width;
  const raw = new Uint8Array(bytes);
  for (let p = 0; p < width; p++) {
    const plane = planes.subarray(p * count, (p + 1) * count);
    for (let i = 0; i < count; i++) raw[i * width + p] = plane[i];
  }
  return raw;
}

/** Bytes as base64 text (what the bundle's `data` holds). */
export function base64Of(bytes) {
  const parts = [];
  const chunk = 3 * 8192;
  for (let i = 0; i < bytes.length; i += chunk) parts.push(btoa(String.fromCharCode.apply(null, bytes.subarray(i, i + chunk))));
  return parts.join("");
}
