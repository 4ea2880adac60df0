// Turns the npm reference tokenizers into the files our loader reads, and records their ids for a
// corpus. usage: node extract_reference.mjs NODE_MODULES_DIR CORPUS_JSON OUT_DIR
//   OUT/llama3/tokenizer.json       Llama 3 vocabulary + merges (llama3-tokenizer-js), HF layout
//   OUT/llama2-spm/tokenizer.model  Llama 2 vocabulary as a SentencePiece BPE model (llama-tokenizer-js)
//   OUT/llama2-json/tokenizer.json  the same vocabulary in HF's metaspace tokenizer.json layout
//   OUT/expected.json               [{text, llama3, llama3_decoded, llama2}] from the reference encoders
// The vocabularies are extracted at test time into the build tree, never committed (see README.md).
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [modulesDir, corpusPath, outDir] = process.argv.slice(2);
const load = async (name) => (await import(pathToFileURL(path.join(modulesDir, name, JSON.parse(
  fs.readFileSync(path.join(modulesDir, name, 'package.json'), 'utf8')).main)).href)).default;
const llama3 = await load('llama3-tokenizer-js');
const llama2 = await load('llama-tokenizer-js');
const corpusDoc = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
const corpus = [...corpusDoc.texts.map((text) => ({ text, llama2: true })), ...corpusDoc.llama3_only.map((text) => ({ text, llama2: false }))];

function mergesInOrder(tok) {
  // tok.merges: "A B" -> priority (grows with the merge's rank).
  return [...tok.merges.entries()].sort((a, b) => a[1] - b[1]).map(([k]) => {
    const sp = k.indexOf(' ', 1);
    return [k.slice(0, sp), k.slice(sp + 1)];
  });
}

function write(file, data) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, data);
}

// ---- Llama 3: tokenizer.json as Meta's HF release lays it out ----
{
  const vocab = {};
  const added = [];
  llama3.vocabById.forEach((piece, id) => {
    if (id < 128000) vocab[piece] = id;
    else added.push({ id, content: piece, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  });
  const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const doc = {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: 'Sequence', processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [], special_tokens: {} }] },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges: mergesInOrder(llama3) },
  };
  write(path.join(outDir, 'llama3', 'tokenizer.json'), JSON.stringify(doc));
  write(path.join(outDir, 'llama3', 'tokenizer_config.json'), JSON.stringify({
    bos_token: '<|begin_of_text|>', eos_token: '<|end_of_text|>',
    chat_template: "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}" }));
}

// ---- Llama 2: scores from merge ranks (SentencePiece BPE merges the best-scored piece first) ----
const llama2Merges = mergesInOrder(llama2);
const rankOf = new Map();
llama2Merges.forEach(([a, b], rank) => { if (!rankOf.has(a + b)) rankOf.set(a + b, rank); });

{
  // Protocol buffer wire format of sentencepiece_model.proto, written by hand (no protobuf package).
  const varint = (n) => { const out = []; let v = BigInt.asUintN(64, BigInt(n)); do { let b = Number(v & 0x7fn); v >>= 7n; if (v) b |= 0x80; out.push(b); } while (v); return Buffer.from(out); };
  const key = (field, wire) => varint((field << 3) | wire);
  const intField = (f, v) => Buffer.concat([key(f, 0), varint(v)]);
  const bytesField = (f, buf) => Buffer.concat([key(f, 2), varint(buf.length), buf]);
  const strField = (f, s) => bytesField(f, Buffer.from(s, 'utf8'));
  const floatField = (f, v) => { const b = Buffer.alloc(4); b.writeFloatLE(v); return Buffer.concat([key(f, 5), b]); };
  const NORMAL = 1, UNKNOWN = 2, CONTROL = 3, BYTE = 6;
  const pieces = llama2.vocabById.map((piece, id) => {
    let type = NORMAL, score = 0;
    if (id === 0) type = UNKNOWN;
    else if (id === 1 || id === 2) type = CONTROL;
    else if (/^<0x[0-9A-F]{2}>$/.test(piece)) type = BYTE;
    else score = rankOf.has(piece) ? -rankOf.get(piece) : -1e9;
    return bytesField(1, Buffer.concat([strField(1, piece), floatField(2, score), intField(3, type)]));
  });
  const trainer = Buffer.concat([intField(3, 2 /* BPE */), intField(4, llama2.vocabById.length), intField(35, 1 /* byte_fallback */),
    intField(40, 0), intField(41, 1), intField(42, 2), intField(43, -1)]);
  const normalizer = Buffer.concat([strField(1, 'identity'), intField(3, 1 /* add_dummy_prefix */),
    intField(4, 0 /* remove_extra_whitespaces */), intField(5, 1 /* escape_whitespaces */)]);
  write(path.join(outDir, 'llama2-spm', 'tokenizer.model'), Buffer.concat([...pieces, bytesField(2, trainer), bytesField(3, normalizer)]));
}
{
  const vocab = {};
  llama2.vocabById.forEach((piece, id) => { vocab[piece] = id; });
  const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  const doc = {
    version: '1.0', added_tokens: [special(0, '<unk>'), special(1, '<s>'), special(2, '</s>')],
    normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] },
    pre_tokenizer: null,
    post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }], pair: [], special_tokens: {} },
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' },
      { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: true, byte_fallback: true, vocab, merges: llama2Merges.map(([a, b]) => a + ' ' + b) },
  };
  write(path.join(outDir, 'llama2-json', 'tokenizer.json'), JSON.stringify(doc));
}

// ---- reference ids ----
const expected = corpus.map(({ text, llama2: both }) => {
  const ids3 = llama3.encode(text, { bos: false, eos: false });
  const entry = { text, llama3: ids3, llama3_decoded: llama3.decode(ids3) };
  if (both) entry.llama2 = llama2.encode(text);
  return entry;
});
write(path.join(outDir, 'expected.json'), JSON.stringify(expected, null, 0));
console.log(`extract_reference: ${corpus.length} texts, llama3 ${llama3.vocabById.length} ids, llama2 ${llama2.vocabById.length} ids -> ${outDir}`);
