"""Byte-level BPE: training and encoding, in the GGUF "gpt2" form that offgraph and llama.cpp load.

Words come from the `llama4` pre-tokenizer (the GPT-4o split regex of MUSE_GLIMMER.md section 9),
bytes are shown through the GPT-2 byte-to-character table, and merges are applied by rank,
leftmost first on ties (as both runtimes do), so encoding here gives the ids the runtimes give.
"""

import collections

import regex

# The split regex of the `llama4` pre-tokenizer (MUSE_GLIMMER.md section 9).
SPLIT = regex.compile(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_chars():
    """The GPT-2 table: printable bytes stand for themselves, the others for code points 256+."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


BYTE_CHARS = byte_chars()


def words(text):
    return SPLIT.findall(text)


def train(word_counts, n_merges):
    """Greedy BPE over a word -> count map. Returns merges as pairs of token strings (byte-mapped).

    Ties go to the pair whose (left, right) strings sort first, so the result depends only on the
    counts."""
    vocab = [tuple(BYTE_CHARS[b] for b in w.encode("utf-8")) for w in word_counts]
    counts = list(word_counts.values())
    seqs = [list(v) for v in vocab]
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            pair_count[(a, b)] += counts[i]
            where[(a, b)].add(i)
    merges = []
    for _ in range(n_merges):
        if not pair_count:
            break
        best = min(pair_count.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pair_count[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        for i in list(where[best]):
            s, c = seqs[i], counts[i]
            for a, b in zip(s, s[1:]):
                pair_count[(a, b)] -= c
                if pair_count[(a, b)] <= 0:
                    del pair_count[(a, b)]
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == best[0] and s[j + 1] == best[1]:
                    out.append(joined)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] += c
                where[(a, b)].add(i)
        del where[best]
    return merges


class Encoder:
    """Encodes text with a trained vocabulary; special tokens are matched in the text when asked."""

    def __init__(self, tokens, merges, specials):
        self.tokens = tokens
        self.id = {t: i for i, t in enumerate(tokens)}
        self.rank = {m: r for r, m in enumerate(merges)}
        self.specials = sorted(specials, key=len, reverse=True)
        self.cache = {}
        self.special_re = regex.compile("|".join(regex.escape(s) for s in self.specials)) if specials else None

    def _word(self, w):
        hit = self.cache.get(w)
        if hit is not None:
            return hit
        s = [BYTE_CHARS[b] for b in w.encode("utf-8")]
        while len(s) > 1:
            best, at = None, -1
            for j in range(len(s) - 1):
                r = self.rank.get((s[j], s[j + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, j
            if best is None:
                break
            # Merge every occurrence of the best pair, leftmost first.
            pair = (s[at], s[at + 1])
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and (s[j], s[j + 1]) == pair:
                    out.append(s[j] + s[j + 1])
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            s = out
        ids = [self.id[p] for p in s]
        self.cache[w] = ids
        return ids

    def encode_plain(self, text):
        out = []
        for w in words(text):
            out.extend(self._word(w))
        return out

    def encode(self, text, parse_special=True):
        if not parse_special or self.special_re is None:
            return self.encode_plain(text)
        out, at = [], 0
        for m in self.special_re.finditer(text):
            out.extend(self.encode_plain(text[at : m.start()]))
            out.append(self.id[m.group(0)])
            at = m.end()
        out.extend(self.encode_plain(text[at:]))
        return out

    def decode(self, ids):
        inv = {c: b for b, c in enumerate(BYTE_CHARS)}
        raw = bytearray()
        for i in ids:
            t = self.tokens[i]
            if t in self.specials:
                raw += t.encode("utf-8")
            else:
                raw += bytes(inv[c] for c in t)
        return raw.decode("utf-8", errors="replace")
