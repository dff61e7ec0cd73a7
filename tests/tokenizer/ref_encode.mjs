// ref_encode.mjs — the JavaScript reference tokenizer (@lenml/tokenizers 3.7.2, installed by
// tools/fetch_tokenizer_js.sh) run over a corpus, or timed over one, for the C tokenizer's tests
// and benchmark. It loads the same tokenizer.json the C code loads.
//
//   node tests/tokenizer/ref_encode.mjs --corpus FILE --out FILE [--tokenizer JSON] [--js DIR]
//       writes "#unicode <node's Unicode version>", then two lines per record: the ids with
//       added tokens recognised (the reference's _encode_text), then the ids with none
//       recognised (pre_tokenizer + model only: the C default mode); ids comma-separated, an
//       empty line for none. A record holding a code point whose classes under this node differ
//       from model/unicode_tables.c (a node with another Unicode version) gets two lines
//       "#skip U+XXXX ..." instead, so the comparison is only made where both agree.
//   node tests/tokenizer/ref_encode.mjs --bench FILE [--min-mb N] ...
//       encodes every record (repeated until N MB, default 10) and decodes the ids; prints one
//       JSON line {"bytes":..., "encode_s":..., "decode_s":..., "tokens":...} (CPU seconds).
//
// Corpus format (tests/tokenizer/gen_corpus.js): records of "<decimal byte length>\n<bytes>\n".
// Bytes are decoded with TextDecoder (WHATWG: each invalid sequence -> U+FFFD), which is the
// rule the C encoder applies to invalid UTF-8.
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { resolve, dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';

const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def;
};
const jsDir = resolve(opt('--js', process.env.DSV32_TOKENIZER_JS || 'build/tokenizer/js'));
const tokPath = resolve(opt('--tokenizer', 'build/tokenizer/tokenizer.json'));
const lib = join(jsDir, 'node_modules/@lenml/tokenizers/dist/main.mjs');
if (!existsSync(lib)) {
  console.error(`ref_encode: the reference is not installed (${lib} missing): run make tokenizer`);
  process.exit(3);
}
const { TokenizerLoader } = await import(pathToFileURL(lib).href);

const tokenizerJSON = JSON.parse(readFileSync(tokPath, 'utf8'));
const cfgPath = join(dirname(tokPath), 'tokenizer_config.json');
const tokenizerConfig = existsSync(cfgPath)
  ? JSON.parse(readFileSync(cfgPath, 'utf8'))
  : { tokenizer_class: 'LlamaTokenizerFast', legacy: true };
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });

function readCorpus(path) {
  const buf = readFileSync(path);
  const recs = [];
  let p = 0;
  while (p < buf.length) {
    const nl = buf.indexOf(10, p);
    if (nl < 0) throw new Error(`${path}: bad record header at byte ${p}`);
    const n = Number(buf.toString('latin1', p, nl));
    if (!Number.isInteger(n) || nl + 1 + n + 1 > buf.length || buf[nl + 1 + n] !== 10)
      throw new Error(`${path}: bad record at byte ${p}`);
    recs.push(buf.subarray(nl + 1, nl + 1 + n));
    p = nl + 1 + n + 1;
  }
  return recs;
}

const dec = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
const toIds = (tokens) => tokens.map((t) => {
  const id = tok.model.tokens_to_ids.get(t);
  if (id === undefined) throw new Error(`reference produced a token with no id: ${JSON.stringify(t)}`);
  return id;
});
const encodeSpecial = (text) => toIds(tok._encode_text(text));
const encodePlain = (text) => (text.length ? toIds(tok.model(tok.pre_tokenizer(text))) : []);

// The C tables, read from model/unicode_tables.c, to find code points whose classes differ
// under this node's regexes.
const classRe = [/^\p{L}$/u, /^\p{M}$/u, /^\p{N}$/u, /^\p{P}$/u, /^\p{S}$/u, /^\s$/u,
  /^[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]$/u];
const bitName = ['UNI_L', 'UNI_M', 'UNI_N', 'UNI_P', 'UNI_S', 'UNI_WS', 'UNI_CJK'];
function loadTables() {
  const src = readFileSync(resolve(opt('--tables', 'model/unicode_tables.c')), 'utf8');
  const ranges = [];
  for (const m of src.matchAll(/\{0x([0-9A-F]+), 0x([0-9A-F]+), ([A-Z_ |]+)\}/g)) {
    let bits = 0;
    for (const n of m[3].split('|')) bits |= 1 << bitName.indexOf(n.trim());
    ranges.push([parseInt(m[1], 16), parseInt(m[2], 16), bits]);
  }
  return ranges;
}
const tableRanges = loadTables();
const tableBits = (cp) => {
  let lo = 0, hi = tableRanges.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1, r = tableRanges[mid];
    if (cp < r[0]) hi = mid - 1;
    else if (cp > r[1]) lo = mid + 1;
    else return r[2];
  }
  return 0;
};
const agreeMemo = new Map();
function disagreeing(text) {
  const bad = [];
  for (const ch of text) {
    const cp = ch.codePointAt(0);
    let ok = agreeMemo.get(cp);
    if (ok === undefined) {
      let b = 0;
      for (let i = 0; i < classRe.length; i++) if (classRe[i].test(ch)) b |= 1 << i;
      ok = b === tableBits(cp);
      agreeMemo.set(cp, ok);
    }
    if (!ok) bad.push('U+' + cp.toString(16).toUpperCase().padStart(4, '0'));
  }
  return bad;
}

const corpus = opt('--corpus');
const bench = opt('--bench');
if (corpus) {
  const out = [`#unicode ${process.versions.unicode}`];
  for (const r of readCorpus(corpus)) {
    const text = dec.decode(r);
    const bad = disagreeing(text);
    if (bad.length) {
      const line = '#skip ' + [...new Set(bad)].slice(0, 8).join(' ');
      out.push(line, line);
      continue;
    }
    out.push(encodeSpecial(text).join(','));
    out.push(encodePlain(text).join(','));
  }
  writeFileSync(opt('--out', '/dev/stdout'), out.join('\n') + '\n');
} else if (bench) {
  const recs = readCorpus(bench).map((r) => dec.decode(r));
  const minBytes = Number(opt('--min-mb', '10')) * 1e6;
  const texts = [];
  let bytes = 0;
  while (bytes < minBytes)
    for (const t of recs) {
      texts.push(t);
      bytes += Buffer.byteLength(t);
    }
  // CPU seconds of this process (user + system), as the C side measures its thread's.
  const cpu = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  };
  let t0 = cpu();
  const ids = texts.map(encodeSpecial);
  const encS = cpu() - t0;
  t0 = cpu();
  let outBytes = 0;
  for (const v of ids) if (v.length) outBytes += tok.decode(v).length;
  const decS = cpu() - t0;
  const tokens = ids.reduce((a, v) => a + v.length, 0);
  console.log(JSON.stringify({ bytes, encode_s: encS, decode_s: decS, tokens, out_chars: outBytes }));
} else {
  console.error('usage: ref_encode.mjs --corpus FILE --out FILE | --bench FILE');
  process.exit(2);
}
