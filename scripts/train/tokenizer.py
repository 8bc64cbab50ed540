"""Byte-level BPE: training, encoding/decoding, and Hugging Face tokenizer.json export.

Pre-tokenization is the GPT-2 split regex, written into tokenizer.json verbatim:

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

Python's `re` has no \\p{..}, so the same pattern is compiled here with explicit character
classes built from unicodedata: \\p{L} = categories Lu Ll Lt Lm Lo, \\p{N} = Nd Nl No, and \\s = the
Unicode White_Space property (what Oniguruma / PCRE2-with-UCP use; Python's own \\s would add
U+001C..U+001F). Then every piece is UTF-8 encoded and mapped through the GPT-2 byte-to-unicode
table, and BPE merges are applied by rank (lowest rank first, leftmost first), which is the
Hugging Face `BPE` model's behaviour.

Vocabulary layout: 0 = <|bos|>, 1 = <|eos|> (special, added tokens), 2..257 = the 256 single bytes
in byte order, 258.. = merges in the order they were learned.
"""

import heapq
import json
import re
import sys
import unicodedata
from collections import Counter, defaultdict

SPECIALS = ["<|bos|>", "<|eos|>"]
BOS_ID, EOS_ID = 0, 1
BYTE_BASE = len(SPECIALS)

HF_SPLIT_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                    r"|\s+(?!\S)|\s+")

WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
          list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _ranges(pred):
    out, start = [], None
    for cp in range(sys.maxunicode + 2):
        inside = cp <= sys.maxunicode and pred(chr(cp))
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            out.append((start, cp - 1))
            start = None
    return out


def _cls(ranges):
    return "".join("\\U%08x" % a if a == b else "\\U%08x-\\U%08x" % (a, b) for a, b in ranges)


def python_split_regex():
    letters = _cls(_ranges(lambda c: unicodedata.category(c) in ("Lu", "Ll", "Lt", "Lm", "Lo")))
    numbers = _cls(_ranges(lambda c: unicodedata.category(c) in ("Nd", "Nl", "No")))
    ws = _cls(WHITE_SPACE)
    pat = (r"'s|'t|'re|'ve|'m|'ll|'d| ?[%(L)s]+| ?[%(N)s]+| ?[^%(S)s%(L)s%(N)s]+"
           r"|[%(S)s]+(?![^%(S)s])|[%(S)s]+") % {"L": letters, "N": numbers, "S": ws}
    return re.compile(pat)


_SPLIT = None


def pre_split(text):
    global _SPLIT
    if _SPLIT is None:
        _SPLIT = python_split_regex()
    return _SPLIT.findall(text)


class ByteBPE:
    def __init__(self, merges):
        """merges: list of (left, right) symbol strings in rank order."""
        self.b2u = bytes_to_unicode()
        self.u2b = {v: k for k, v in self.b2u.items()}
        self.merges = list(merges)
        self.vocab = {s: i for i, s in enumerate(SPECIALS)}
        for b in range(256):
            self.vocab[self.b2u[b]] = BYTE_BASE + b
        for a, b in self.merges:
            self.vocab[a + b] = len(self.vocab)
        self.id_to_token = {i: s for s, i in self.vocab.items()}
        self.ranks = {pair: r for r, pair in enumerate(self.merges)}
        self.cache = {}
        self.special_re = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")

    def __len__(self):
        return len(self.vocab)

    def _bpe(self, piece):
        word = [self.b2u[b] for b in piece.encode("utf-8")]
        ranks = self.ranks
        while len(word) > 1:
            best, best_rank = None, None
            for pair in zip(word, word[1:]):
                r = ranks.get(pair)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = pair, r
            if best is None:
                break
            a, b = best
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return [self.vocab[s] for s in word]

    def encode_ordinary(self, text):
        """Ids of text with no special-token matching and no BOS."""
        out = []
        cache = self.cache
        for piece in pre_split(text):
            ids = cache.get(piece)
            if ids is None:
                ids = self._bpe(piece)
                if len(cache) < 2_000_000:
                    cache[piece] = ids
            out.extend(ids)
        return out

    def encode(self, text, add_bos=True):
        """HF semantics: special tokens in the text become their ids; BOS prepended."""
        out = [BOS_ID] if add_bos else []
        for part in self.special_re.split(text):
            if part in SPECIALS:
                out.append(self.vocab[part])
            elif part:
                out.extend(self.encode_ordinary(part))
        return out

    def decode(self, ids, skip_special=True):
        data = bytearray()
        text = []
        for i in ids:
            tok = self.id_to_token[int(i)]
            if tok in SPECIALS:
                if not skip_special:
                    text.append(data.decode("utf-8", "replace"))
                    data = bytearray()
                    text.append(tok)
                continue
            data.extend(self.u2b[c] for c in tok)
        text.append(data.decode("utf-8", "replace"))
        return "".join(text)

    # ------------------------------------------------------------------ HF export

    def hf_tokenizer_json(self):
        added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
        bos = SPECIALS[BOS_ID]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": HF_SPLIT_PATTERN},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": False}]},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [BOS_ID], "tokens": [bos]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": self.vocab,
                      "merges": ["%s %s" % m for m in self.merges]},
        }

    # A code model has no chat format of its own: the conversation becomes what it was trained
    # on, Python. A system message is a module docstring, a user message a comment, and an
    # assistant message the code that follows, ended by EOS when a later turn follows.
    CHAT_TEMPLATE = "{{- bos_token -}}\n{%- for message in messages -%}\n{%- if message['role'] in ['system', 'developer'] -%}\n{{- '\"\"\"' + message['content'] | trim + '\"\"\"\\n\\n' -}}\n{%- elif message['role'] == 'user' -%}\n{{- '# ' + message['content'] | trim | replace('\\n', '\\n# ') + '\\n' -}}\n{%- elif message['role'] == 'assistant' -%}\n{{- message['content'] | trim -}}\n{%- if not loop.last -%}{{- eos_token + '\\n' -}}{%- endif -%}\n{%- else -%}\n{{- raise_exception('roles are system, user and assistant') -}}\n{%- endif -%}\n{%- endfor -%}\n"

    def hf_tokenizer_config(self, model_max_length):
        decl = {}
        for i, s in enumerate(SPECIALS):
            decl[str(i)] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": True}
        return {"added_tokens_decoder": decl, "bos_token": SPECIALS[BOS_ID],
                "eos_token": SPECIALS[EOS_ID], "pad_token": None, "add_bos_token": True,
                "add_eos_token": False, "clean_up_tokenization_spaces": False,
                "model_max_length": model_max_length,
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": self.CHAT_TEMPLATE}

    def save(self, dir_path, model_max_length):
        with open(dir_path + "/tokenizer.json", "w", encoding="utf-8") as f:
            json.dump(self.hf_tokenizer_json(), f, ensure_ascii=False, indent=None)
            f.write("\n")
        with open(dir_path + "/tokenizer_config.json", "w", encoding="utf-8") as f:
            json.dump(self.hf_tokenizer_config(model_max_length), f, indent=2, ensure_ascii=False)
            f.write("\n")

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                  for m in j["model"]["merges"]]
        tok = cls(merges)
        assert tok.vocab == j["model"]["vocab"], "vocab layout differs from " + path
        return tok


def train_bpe(texts, vocab_size, log=print):
    """Learns vocab_size - 258 merges from an iterable of strings; deterministic.

    Words (pre-split pieces) are counted once; merges then run on word types with incremental
    pair-count updates and a lazy max-heap keyed by (count, pair): ties go to the
    lexicographically smallest pair.
    """
    b2u = bytes_to_unicode()
    counts = Counter()
    for t in texts:
        counts.update(pre_split(t))
    items = sorted(counts.items())
    words = [[b2u[b] for b in w.encode("utf-8")] for w, _ in items]
    freqs = [c for _, c in items]
    log("bpe: %d pieces, %d distinct" % (sum(freqs), len(words)))
    pair_count = defaultdict(int)
    where = defaultdict(set)
    for wi, w in enumerate(words):
        f = freqs[wi]
        for pair in zip(w, w[1:]):
            pair_count[pair] += f
            where[pair].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    n_merges = vocab_size - BYTE_BASE - 256
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc:
            continue  # stale entry
        if -negc < 2:
            break
        merges.append(pair)
        a, b = pair
        ab = a + b
        touched = set()
        for wi in sorted(where.pop(pair, ())):
            w = words[wi]
            f = freqs[wi]
            old = Counter(zip(w, w[1:]))
            nw, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    nw.append(ab)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            words[wi] = nw
            new = Counter(zip(nw, nw[1:]))
            for p, c in old.items():
                if new.get(p, 0) != c:
                    pair_count[p] -= c * f
                    touched.add(p)
                    if p not in new and p != pair:
                        where[p].discard(wi)
            for p, c in new.items():
                if old.get(p, 0) != c:
                    pair_count[p] += c * f
                    touched.add(p)
                    where[p].add(wi)
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if p == pair:
                continue
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
                where.pop(p, None)
        if len(merges) % 500 == 0:
            log("bpe: %d merges, last %r count %d" % (len(merges), ab, -negc))
    return ByteBPE(merges)
