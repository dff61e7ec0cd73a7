#!/usr/bin/env node
// gen_corpus.js — builds the tokenizer test corpus tests/tokenizer/corpus.bin, deterministically
// (a seeded PRNG; no dates, no environment), from the texts in tests/tokenizer/texts/ (man pages
// in ten languages, CJK samples from CPython's test suite, source code in C, Go, Rust, Python
// and JavaScript, DeepSeek chat-encoding vectors, a hand-written multilingual sample) and from
// tokenizer.json's added tokens.
//
//   node tests/tokenizer/gen_corpus.js [--tokenizer build/tokenizer/tokenizer.json] \
//        [--out tests/tokenizer/corpus.bin]
//
// Records: text chunks of every size; mixtures of scripts; random code points across the
// classes the pre-tokenizer distinguishes (letters, marks, numbers of several scripts,
// punctuation, symbols, every kind of whitespace, CJK/kana edges, emoji with ZWJ, modifiers and
// variation selectors, unassigned and private-use code points); every added token as text, in
// context; long runs of spaces, tabs, newlines and digits; long words for the heap BPE path;
// invalid UTF-8 of every kind. Format: "<decimal byte length>\n<bytes>\n" per record.
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
const opt = (n, d) => (args.indexOf(n) >= 0 ? args[args.indexOf(n) + 1] : d);
const tokPath = opt('--tokenizer', 'build/tokenizer/tokenizer.json');
const outPath = opt('--out', path.join(__dirname, 'corpus.bin'));
const textDir = path.join(__dirname, 'texts');

// splitmix32-ish PRNG, seeded
let seed = 0x5eed1234;
function rnd() {
  seed = (seed + 0x9e3779b9) | 0;
  let z = seed;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return ((z ^ (z >>> 16)) >>> 0) / 4294967296;
}
const ri = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1)); // inclusive
const pick = (a) => a[ri(0, a.length - 1)];

const records = [];
const add = (b) => records.push(Buffer.isBuffer(b) ? b : Buffer.from(b, 'utf8'));

// Cut a buffer at a UTF-8 character boundary at or after i.
const boundary = (b, i) => {
  while (i < b.length && (b[i] & 0xc0) === 0x80) i++;
  return i;
};
const texts = fs.readdirSync(textDir).sort().map((f) => fs.readFileSync(path.join(textDir, f)));
const snippet = (maxLen) => {
  const t = pick(texts);
  const a = boundary(t, ri(0, t.length - 1));
  const e = boundary(t, Math.min(t.length, a + ri(1, maxLen)));
  return t.subarray(a, e);
};

// 1. chunks of every text, of every size
for (const t of texts) {
  let p = 0;
  while (p < t.length) {
    const r = rnd();
    const len = r < 0.3 ? ri(1, 40) : r < 0.85 ? ri(40, 400) : ri(400, 3000);
    const e = boundary(t, Math.min(t.length, p + len));
    add(t.subarray(p, e));
    p = e;
  }
}

// 2. mixtures of scripts and separators
const seps = [' ', '  ', '\n', '\n\n', '\r\n', '\t', ' \t ', '   \n  ', '\u3000', '\u00a0', '', '', '123', ' 4567 ', '-', '...'];
for (let i = 0; i < 400; i++) {
  const parts = [];
  for (let k = ri(2, 6); k > 0; k--) parts.push(snippet(200), Buffer.from(pick(seps)));
  add(Buffer.concat(parts));
}

// 3. random code points from the classes the scanner distinguishes
const ranges = [
  [0x20, 0x7e], [0x20, 0x7e], [0x20, 0x7e], [0x30, 0x39], [0x41, 0x5a], [0x61, 0x7a], [0x21, 0x2f],
  [0xa0, 0xff], [0x100, 0x24f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
  [0x600, 0x6ff], [0x660, 0x669], [0x900, 0x97f], [0x966, 0x96f], [0xe00, 0xe7f], [0x1100, 0x11ff],
  [0x1ab0, 0x1aff], [0x2000, 0x206f], [0x20a0, 0x20cf], [0x20d0, 0x20ff], [0x2100, 0x214f],
  [0x2150, 0x218f], [0x2190, 0x23ff], [0x2460, 0x24ff], [0x2500, 0x27bf], [0x2e80, 0x2fdf],
  [0x3000, 0x303f], [0x3040, 0x309f], [0x309a, 0x30a1], [0x30a0, 0x30ff], [0x30fa, 0x3100],
  [0x3400, 0x4dbf], [0x4e00, 0x4e10], [0x4e00, 0x9fff], [0x9fa0, 0x9fb0], [0xac00, 0xd7a3],
  [0xe000, 0xf8ff], [0xf900, 0xfaff], [0xfb00, 0xfdff], [0xfe00, 0xfe0f], [0xfe10, 0xfe6f],
  [0xff00, 0xffef], [0xfff0, 0xfffd], [0x10000, 0x1ffff], [0x1d400, 0x1d7ff], [0x1f000, 0x1faff],
  [0x1f3fb, 0x1f3ff], [0x1f600, 0x1f64f], [0x20000, 0x2a6df], [0x2a6e0, 0x3ffff], [0xe0000, 0xe01ef],
  [0xf0000, 0x10ffff], [0x0, 0x1f], [0x7f, 0x9f],
];
const spaces = [0x9, 0xa, 0xb, 0xc, 0xd, 0x20, 0x85, 0xa0, 0x1680, 0x180e, 0x2000, 0x2005, 0x200a,
  0x200b, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff];
const specials = [0x200d, 0x200c, 0xfe0f, 0x20e3, 0x1f3fd, 0x301, 0x308];
for (let i = 0; i < 700; i++) {
  let s = '';
  for (let k = ri(1, 60); k > 0; k--) {
    const r = rnd();
    let cp;
    if (r < 0.15) cp = pick(spaces);
    else if (r < 0.22) cp = pick(specials);
    else {
      const [lo, hi] = pick(ranges);
      cp = ri(lo, hi);
    }
    if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd;
    s += String.fromCodePoint(cp);
  }
  add(s);
}

// 4. every added token as text, in context; and chat-like prompts
const tj = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
const added = tj.added_tokens.map((a) => a.content);
const ctx = [(t) => t, (t) => `x${t}y`, (t) => ` ${t} `, (t) => `\n${t}\n`, (t) => `${t}${t}`,
  (t) => `Hello${t}world`, (t) => `  ${t}12`, (t) => `<${t}>`, (t) => `${t.slice(0, -1)}`,
  (t) => `中文${t}。`];
for (const t of added) add(pick(ctx)(t));
for (let i = 0; i < 150; i++) {
  const parts = [];
  for (let k = ri(2, 8); k > 0; k--) parts.push(Buffer.from(pick(added)), snippet(120));
  add(Buffer.concat(parts));
}

// 5. runs of whitespace and digits
const ws = [' ', '\t', '\n', '\r', '\r\n', '\u00a0', '\u3000', '\v', '\f'];
for (let i = 0; i < 200; i++) {
  let s = pick(['', 'word', '中文', '.', '1', ' x']);
  for (let k = ri(1, 4); k > 0; k--) {
    const c = rnd() < 0.5 ? ' ' : pick(ws);
    s += c.repeat(ri(1, rnd() < 0.8 ? 12 : 300)) + pick(['', 'a', 'B', '9', '!', '中', '\u0301', 'é', ' x', '']);
  }
  add(s);
}
const digitsets = ['0123456789', '٠١٢٣٤٥٦٧٨٩', '०१२३४५६७८९', '０１２３４５６７８９', '²³¹¼½¾', 'ⅠⅡⅢⅣⅫ', '①②③⑳'];
for (let i = 0; i < 200; i++) {
  let s = '';
  const set = Array.from(pick(digitsets));
  const n = rnd() < 0.8 ? ri(1, 20) : ri(20, 1000);
  for (let k = 0; k < n; k++) s += rnd() < 0.9 ? pick(set) : pick([',', '.', ' ', 'x', '-', '\n']);
  add(s);
}

// 6. long words (heap BPE), long runs of one class
add('a'.repeat(5000));
add('abcdefghij'.repeat(400));
add(Array.from({ length: 3000 }, () => String.fromCharCode(ri(0x61, 0x7a))).join(''));
add(Array.from({ length: 800 }, () => String.fromCodePoint(ri(0x4e00, 0x9fa5))).join(''));
add('😀'.repeat(300) + '!?'.repeat(100));
add('\u0301'.repeat(500));
add(' '.repeat(10000) + 'x');
add('\n'.repeat(3000));
add(Buffer.concat(texts.slice(0, 8)));

// 7. invalid UTF-8
const bad = [[0x80], [0xbf], [0xc0, 0xaf], [0xc1, 0xbf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80],
  [0xed, 0xbf, 0xbf], [0xf0, 0x80, 0x80, 0xaf], [0xf4, 0x90, 0x80, 0x80], [0xf5], [0xff], [0xfe],
  [0xc3], [0xe4, 0xb8], [0xf0, 0x9f, 0x98], [0xe4], [0xf0, 0x9f], [0xc3, 0xc3, 0xa9]];
for (let i = 0; i < 300; i++) {
  const r = rnd();
  if (r < 0.3) {
    add(Buffer.from(Array.from({ length: ri(1, 64) }, () => ri(0, 255))));
  } else if (r < 0.7) {
    const s = Buffer.from(snippet(300));
    if (s.length) s[ri(0, s.length - 1)] = ri(0x80, 0xff);
    add(s);
  } else {
    const parts = [];
    for (let k = ri(1, 5); k > 0; k--) parts.push(snippet(40), Buffer.from(pick(bad)));
    add(Buffer.concat(parts));
  }
}

const out = [];
for (const r of records) out.push(Buffer.from(`${r.length}\n`), r, Buffer.from('\n'));
fs.writeFileSync(outPath, Buffer.concat(out));
console.error(`gen_corpus: ${records.length} records, ${out.reduce((a, b) => a + b.length, 0)} bytes -> ${outPath}`);
