"""Canonical-tokenization decoding: the mask allows only tokens that keep the token sequence a
prefix of the tokenizer's own (canonical) encoding of some text.

For a byte-level BPE with a pre-tokenizer, a token sequence is canonical iff

1. every pre-token boundary of its text falls between two tokens (no token spans a boundary), and
2. inside one pre-token, every adjacent pair is canonical at merge level
   (:mod:`.canonical_bpe`: a bigram test, decided by rank conflicts along the merge spines).

Pre-token boundaries depend on the text that follows (Llama-3's ``\\s+(?!\\S)``, the greedy runs), so
:class:`CanonicalState` keeps the *open region*: the tokens since the last boundary that no future
text can move. A candidate token is judged on the region's text plus its own, under every
*probe* future (end of text, then one or two characters of each character class): it is allowed
if, under some probe, (1) holds for the whole region plus the token and every junction that is not
a boundary passes the pair test. The verdict depends on the token only through a short
*representative* string (letters, digits, punctuation runs compressed; the classes and the
contraction letters kept), so it is computed once per (region, representative) with the
tokenizer's own pre-tokenizer on representative strings, cached per tokenizer, and turned into two
bitsets: tokens allowed outright (a boundary before them) and tokens allowed if the merge-level pair
test with the last token passes. The mask is then ``grammar & (ok | (need_pair & ~conflicts(last)))``.

Guarantees and limits (see the README section "Canonical tokenization"): the test is exact for
what it sees (the pair test is exact at merge level; the pre-token test runs the real
pre-tokenizer), the futures are represented by the probes, and the decision is per step: a token
can be canonical for some continuation that the grammar then forbids (a *dead end*: the matcher's
canonical mask is then empty but for what the grammar needs; see :attr:`CanonicalState.dead_end`).
"""
from __future__ import annotations

import array
import functools
import threading
import time
import unicodedata
from collections import OrderedDict

import numpy as np

from ..errors import CanonicalTokenizationError
from .canonical_bpe import BpeCanon
from .canonical_split import FV_DEAD, FV_VIABLE, SIGMA, and_allowed, any_outside, forced_verdicts, narrow_witnessed
from .canonical_split import ids_of_words as _ids_of_words
from .canonical_split import one_first_byte
from .canonical_split import verdict_words as _verdict_words
from .canonical_spec import CanonicalSpec, canonical_spec
from .lexdfa import FastCall

OK, NEED_PAIR, REJECT = 0, 1, 2
#: a forced-text search's verdict (truthy) when the candidate reached a pre-token boundary that no
#: future moves within the forced text (:meth:`CanonicalState._forced_viable`)
CERTAIN = 2
# called on every canonical mask: through the entry point of their one signature (no type matching)
_and_allowed = FastCall(and_allowed)
_one_first_byte = FastCall(one_first_byte)
_any_outside = FastCall(any_outside)
_narrow_witnessed = FastCall(narrow_witnessed)
_forced_verdicts = FastCall(forced_verdicts)
_CONTRACTION = frozenset("strevmld")
#: the bytes of a token of whitespace alone
_WS_BYTES = frozenset(b" \t\n\r\x0b\x0c")
#: the follower tables of the one-step lookahead kept per tokenizer (one per state before a narrow
#: token: CanonicalState._first_table; the MaskBench sample's passes make 14)
MAX_FIRST_TABLES = 1024
#: a representative's character -> its code in the split program's alphabet
_SIGMA_CODE = {c: i for i, c in enumerate(SIGMA)}


def _last_code(region: str, pending: bytes):
    """The index into :attr:`CanonicalTokenizer.fresh_after` (``fresh_words``, ``joined_words``)
    for a region: the code of its last character, -1 for the empty region, None after an
    unfinished character (or a character outside the alphabet)."""
    if pending:
        return None
    return _SIGMA_CODE.get(region[-1]) if region else -1
_NO_CONTRACTION = str.maketrans({c: "x" for c in _CONTRACTION})
_PROBE_CHARS = ["x", ".", " ", "\n", "1", "s", "'", "\t", "\r"]
# the future matters through its next character and, after whitespace, through how the run goes on
PROBES = [""] + _PROBE_CHARS + [" x", " .", " 1", " \n", "  ", "\tx", "\t\n", "\n ", "\nx", "\n\n", "\r\n",
                                 " '", "\t "]
_MAX_RUN = 3


@functools.lru_cache(maxsize=65536)
def _char_class(c: str) -> str:
    if c in " \n\r'":
        return c
    if c.isspace():
        return "\t"
    cat = unicodedata.category(c)
    if cat[0] == "L":
        return "L"
    if cat[0] == "N":
        return "1"
    return "."


@functools.lru_cache(maxsize=65536)
def rep_of(text: str, fold_case: bool = True) -> str:
    """Representative string of one token's (complete) text: same pre-tokenizer behaviour.
    ``fold_case``: the pre-tokenizer's contractions match in any case (``(?i:'s|'t|...)``: Llama-3,
    Qwen), so an upper-case contraction letter stands for its lower case; else (GPT-2's pattern:
    ``'S`` is two pieces) it is any other letter."""
    out = []
    run_cls, run_len = None, 0
    prev = None
    for c in text:
        k = _char_class(c)
        if k == "L":
            lc = c.lower()
            keep = lc if (lc in _CONTRACTION and lc.isascii() and (fold_case or c == lc)
                          and (run_len < 2 or prev == "'")) else "x"
            k2 = "L"
        else:
            keep, k2 = k, k
        if k2 == run_cls and k2 in ("L", ".", " ", "\t", "\n") and run_len >= _MAX_RUN:
            run_len += 1
            prev = c
            continue
        if k2 == run_cls:
            run_len += 1
        else:
            run_cls, run_len = k2, 1
        out.append(keep)
        prev = c
    return "".join(out)


def outside_contractions(rep: str) -> str:
    """A region's representative with each contraction letter that no contraction can hold
    written ``x``: a contraction (``'s``, ``'re``, ``'ll``, ...) starts with an apostrophe, so only
    the one or two letters after an apostrophe can be in one; every other letter matches the
    pattern as any other lower-case letter does. :func:`rep_of` keeps the first letters of each
    token's run (the token before may end in an apostrophe); over the whole region that is known,
    so ``" rex"`` and ``" xxx"`` are one region and share their verdicts. The region starts at a
    boundary no future moves, so an apostrophe before it holds no contraction into it."""
    if _CONTRACTION.isdisjoint(rep):
        return rep
    if "'" not in rep:
        return rep.translate(_NO_CONTRACTION)
    out = list(rep)
    for i, c in enumerate(rep):
        if c in _CONTRACTION and not ((i >= 1 and rep[i - 1] == "'") or (i >= 2 and rep[i - 2] == "'")):
            out[i] = "x"
    return "".join(out)


#: the probes whose first character can stand for an unfinished last character: a character of two
#: bytes or more is a letter (``x``), a number (``1``), other (``.``) or a space other than the ASCII
#: ones (``\t``); never the end of text, nor an ASCII space, newline, apostrophe or contraction letter
_TAIL_CLASS_PROBES = {k: sum(1 << i for i, f in enumerate(PROBES) if f and f[0] == k) for k in "x1.\t"}
#: every probe an unfinished character may stand for (its completions not enumerated)
ALL_TAIL = sum(_TAIL_CLASS_PROBES.values())


def _words_of(ids, n_words: int) -> np.ndarray:
    """The uint32 bitset (``n_words`` words) of the token ids ``ids``."""
    ids = np.asarray(ids, np.int64)
    w = np.zeros(n_words, np.uint32)
    np.bitwise_or.at(w, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
    return w


@functools.lru_cache(maxsize=256, typed=True)
def _tail_probe_list(mask) -> list:
    """The probes of a tail mask (True: every probe a character may stand for)."""
    if mask is True:
        mask = ALL_TAIL
    return [f for i, f in enumerate(PROBES) if (mask >> i) & 1]


@functools.lru_cache(maxsize=1)
def _block_classes() -> np.ndarray:
    """Per block of 64 code points below U+40000, the classes of its characters as bits (1: letter,
    2: number, 4: other, 8: a space; :func:`_char_class`); none for the surrogates. ~60 ms, once."""
    cps = np.arange(0x40000)
    cat = np.array([ord(unicodedata.category(chr(c))[0]) for c in range(0x40000)], np.uint8)
    bits = np.where(cat == ord("L"), 1, np.where(cat == ord("N"), 2, 4)).astype(np.uint8)
    space = np.array([c for c in range(0x40000) if chr(c).isspace()], np.int64)
    bits[space] = 8
    bits[(cps >= 0xD800) & (cps < 0xE000)] = 0
    return np.bitwise_or.reduceat(bits, np.arange(0, 0x40000, 64))


@functools.lru_cache(maxsize=4096)
def tail_probes(part: bytes) -> int:
    """The probes (bits over :data:`PROBES`) that the unfinished last character ``part`` (a lead
    byte and some of its continuation bytes) may stand for: those of the classes of the characters
    it may complete to (``\xe4\xb8`` only to CJK letters, ``\xe2\x89`` only to mathematical signs,
    ``\xe0\xa4`` to Devanagari letters, marks and digits). 0: it completes to no valid character
    (an overlong form, a surrogate, past U+10FFFF)."""
    c = part[0]
    n = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
    cp = c & (0x1F if n == 2 else 0x0F if n == 3 else 0x07)
    for x in part[1:]:
        cp = cp << 6 | (x & 0x3F)
    free = 6 * (n - len(part))
    lo, hi = max(cp << free, (0x80, 0x800, 0x10000)[n - 2]), min(((cp + 1) << free) - 1, 0x10FFFF)
    if lo > hi:
        return 0
    cls = 0
    if lo < 0x40000:
        cls = int(np.bitwise_or.reduce(_block_classes()[lo >> 6: (min(hi, 0x3FFFF) >> 6) + 1]))
    if hi >= 0x40000:
        cls |= 4        # planes 4 to 16: unassigned and private use (other)
    out = 0
    for bit, k in ((1, "x"), (2, "1"), (4, "."), (8, "\t")):
        if cls & bit:
            out |= _TAIL_CLASS_PROBES[k]
    return out


def _utf8_split(b: bytes) -> tuple[int, int]:
    """(number of leading continuation bytes, number of trailing bytes of an unfinished character)."""
    lead = 0
    while lead < len(b) and 0x80 <= b[lead] < 0xC0:
        lead += 1
    tail = 0
    i = len(b) - 1
    while i >= 0 and len(b) - i <= 4:
        c = b[i]
        if c < 0x80:
            break
        if c >= 0xC0:
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            have = len(b) - i
            tail = have if have < need else 0
            break
        i -= 1
    return lead, tail


class CanonicalTokenizer:
    """The tokenizer side of canonical decoding, built once per tokenizer (see module docstring)."""

    def __init__(self, info, spec: CanonicalSpec, bpe: BpeCanon):
        self.info = info
        self.spec = spec
        self.bpe = bpe
        self.vocab_size = info.vocab_size
        self.n_words = (self.vocab_size + 31) // 32
        self.pre = spec.pre_tokenizer
        self._split = None
        if spec.split_pattern is not None:
            import regex

            self._split = regex.compile(spec.split_pattern)
        self._lock = threading.Lock()
        #: whether contractions match in any case (see :func:`rep_of`), asked of the pre-tokenizer
        self.fold_case = 2 not in self._raw_boundaries("a'S")
        t0 = time.perf_counter()
        self._build_signatures()
        self.signature_seconds = time.perf_counter() - t0
        self._build_lookups()
        # per-token scalars as Python sequences: the per-candidate tests index them one token at a
        # time, where a numpy scalar costs ~10x a bytes/array item
        self._reach_b = bytes(np.asarray(bpe.reach, bool).astype(np.uint8))
        self._lead_b = bytes((self.kind == 1).astype(np.uint8))
        self._tail_b = bytes(np.asarray(self.tail).astype(np.uint8))
        self._sig_a = array.array("i", self.sig_of.tolist())
        self._verdicts: OrderedDict = OrderedDict()
        self._bounds: dict = {}
        self._sig_verdicts: dict = {}   # region key -> verdict per signature
        self._base_verdicts: dict = {}  # the same, judged with the tokenizer side (_base_regions)
        self._cuts: dict = {}           # region key -> index of the junction to cut at (-1: none)
        self._conflicts: OrderedDict = OrderedDict()
        self._regions: dict = {}        # (tokens, pair bits, pending) -> (region key, junction tokens)
        #: (region key, last, pending, candidate, forced text after it) -> viable along it
        #: (CanonicalState.prune_dead_ends, _prune_forced_after: verdicts that did not ask the grammar)
        self._forced_verdicts: dict = {}
        self.max_cached_regions = 4096
        self.max_cached_conflicts = 2048
        self.stats = {"region_misses": 0, "region_hits": 0, "conflict_misses": 0, "conflict_hits": 0}
        # a split regex in the supported subset: a region's verdicts in one compiled call
        # (canonical_split); None: judged in Python, one pre-tokenizer call per (candidate, probe)
        self._prog = None
        if self._split is not None:
            self._compile_judge(spec.split_pattern)
        #: a mask of at most this many tokens (and non-zero words) on a region not seen before is
        #: judged token by token; a wider one gets the whole region's verdicts, cached. With the
        #: compiled judge a region costs ~3 ms in one call, and past ~64 tokens a mask's signatures
        #: are most of a region's, judged again at its next visit (MaskBench 1 in 200, Llama-3:
        #: first-pass mean ratio 2.32 -> 2.18 with 64 instead of 4096; 16 and 256 alike)
        self.lazy_limit = 64 if self._prog is not None else 4096
        self._load_kernels()
        self._build_forced_tables()
        #: verdicts of the regions made of one token's representative, judged with the rest of the
        #: tokenizer side (and kept on disk) rather than in a request's first masks
        self.base_region_seconds = 0.0
        if self._prog is not None and self.precompute_regions:
            t0 = time.perf_counter()
            self._base_regions()
            self.base_region_seconds = time.perf_counter() - t0
        self._build_digit_probes()
        self._build_fresh_rows()

    #: judge the regions of one token each (:meth:`_base_regions`) when the tokenizer side is built
    precompute_regions = True

    def _build_digit_probes(self) -> None:
        """The tokens of digits that must end a run of digits: after them, right after a pre-token
        boundary, no token starting with a digit is canonical (Llama-3 groups digits by three, so
        ``20`` may be followed by no digit: ``202`` is one piece). Where the grammar then wants a
        digit (a year under ``\\d{4}``) they are dead ends: :meth:`CanonicalState.prune_dead_ends`
        reads what the grammar allows after them (as the narrow whitespace, with which they share
        :attr:`narrow_index`). Llama-3: 110 tokens (all of one and two digits), ~50 ms; none in
        Qwen's and SmolLM2's, which write each digit alone."""
        tb = self.info.token_bytes
        reach = np.flatnonzero(self.bpe.reach[: self.vocab_size]).tolist()
        digs = [t for t in reach if tb[t] and tb[t].isascii() and tb[t].isdigit()]
        longest = max((len(tb[t]) for t in digs), default=0)
        st = CanonicalState(self)
        ends = []
        # shortest first, up to a length none of whose tokens must end a run (GPT-2's pattern
        # takes any run whole: its single digits may be followed by digits, and its many longer
        # digit tokens are not tried)
        for n in range(1, longest):
            found = False
            for t in digs:
                if len(tb[t]) == n:
                    st.reset()
                    first, _end = st._first_after(t)
                    if not first[0x30 >> 5] & np.uint32(0x3FF << (0x30 & 31)):
                        ends.append(t)
                        found = True
            if not found:
                break
        d = np.array(ends, np.int64)
        self.digit_end_words = _words_of(d, self.n_words)
        #: every token of ASCII digits alone (a mask of these only: a number or a pattern of digits)
        self.digit_words = _words_of(digs, self.n_words)
        _any_outside(self.digit_words, self.digit_words)     # (its kernel loaded now, not in a mask)
        self.narrow_index[d] = self.n_narrow + np.arange(len(d))
        self.n_narrow += len(d)
        self.n_digit_ends = len(d)
        #: the word and bits of the single digits (and of ``a``): the digit lookahead runs where a
        #: digit may come and nothing but digits may (a pattern of so many digits)
        ones = [self.token_of_bytes.get(bytes([c])) for c in b"0123456789"]
        ones = [t for t in ones if t is not None]
        self._digit_probe = None
        if ends and ones and len({t >> 5 for t in ones}) == 1:
            # (and of a letter's token, which a free string's mask holds: no scan there)
            a = self.token_of_bytes.get(b"a")
            self._digit_probe = (ones[0] >> 5, sum(1 << (t & 31) for t in ones),
                                 0 if a is None else a >> 5, 0 if a is None else 1 << (a & 31))

    def _build_fresh_rows(self) -> None:
        """What may follow each narrow token right after a certain pre-token boundary, and where
        that is the state after it: the one-step lookahead's rows (:meth:`CanonicalState._first_table`)
        without pushing the token onto each new region.

        The split program's :func:`~.canonical_split.bigrams` tell which characters no pre-token
        holds side by side (Llama-3: anything but whitespace, then a space or a tab). A narrow token
        starting with ``b`` after a region whose last character ``a`` is such a pair starts at a
        boundary that no future moves, so the region is cut there (:meth:`CanonicalState._settle`)
        and the state after the token is that token alone: its row is the one after it from the
        empty region (``fresh``), whatever the region was. ``fresh_after[a]``: the narrow tokens for
        which that holds after a region ending in the character of code ``a`` (``fresh_after[-1]``:
        after the empty region, all), ``fresh_words[a]`` the same as bits over the vocabulary (None
        without a compiled program: every row is then computed per region). ``ext_bits``/``ext_tok``: per
        narrow token, the bytes ``b`` such that its bytes and ``b`` are a token, and that token
        (:func:`~.canonical_split.narrow_witnessed`). Llama-3: 332 rows, ~0.2 s."""
        from . import canonical_split as cs

        n = max(self.n_narrow, 1)
        first, end, known = np.zeros((n, 8), np.uint32), np.zeros(n, bool), np.zeros(n, bool)
        self.fresh = (first, end, known)
        #: (per narrow token, per vocabulary word) for a region none of whose rows is ``fresh``
        self.no_fresh = (np.zeros(n, bool), np.zeros(self.n_words, np.uint32))
        self.fresh_after = None
        self.fresh_words = None
        #: per last character of a region (as ``fresh_after``): the whitespace among the narrow
        #: tokens whose row after it is not ``fresh`` (they may join the region; None: none)
        self.joined_words = None
        tb = self.info.token_bytes
        toks = np.full(n, -1, np.int64)
        ids = np.flatnonzero(self.narrow_index >= 0)
        toks[self.narrow_index[ids]] = ids
        ext_bits = np.zeros((n, 8), np.uint32)
        ext_tok = np.zeros((n, 256), np.int64)
        for k, t in enumerate(toks.tolist()):
            if t < 0:
                continue
            for c in range(256):
                u = self.token_of_bytes.get(tb[t] + bytes([c]))
                if u is not None:
                    ext_bits[k, c >> 5] |= np.uint32(1 << (c & 31))
                    ext_tok[k, c] = u
        self.ext_bits, self.ext_tok = ext_bits, ext_tok
        z = np.zeros(self.n_words, np.uint32)
        # (its kernel loaded now, not in a mask)
        _narrow_witnessed(z, z.copy(), self.narrow_index, first, known, ext_bits, ext_tok, z, z)
        if self._prog is None or not self.n_narrow:
            return
        pair = cs.bigrams(self._prog)
        code = np.full(n, -1, np.int64)
        st = CanonicalState(self)
        for k, t in enumerate(toks.tolist()):
            rep = rep_of(tb[t].decode("latin-1"), self.fold_case) if t >= 0 else ""
            if not rep or rep[0] not in cs.SIGMA:
                continue
            code[k] = cs.SIGMA.index(rep[0])
            st.reset()
            first[k], end[k] = st._first_after(t)
            known[k] = True
        self.fresh_after = [known & (code >= 0) & ~pair[a][np.maximum(code, 0)] for a in range(len(cs.SIGMA))]
        self.fresh_after.append(known)      # (last: after the empty region, every one)
        self.fresh_words = [_words_of(toks[sel], self.n_words) for sel in self.fresh_after]
        # the whitespace among the narrow tokens (the rest: digits that must end a run)
        ws = np.zeros(n, bool)
        ws[: self.n_narrow - self.n_digit_ends] = True
        self.joined_words = [None if not (ws & ~sel).any() else _words_of(toks[ws & ~sel], self.n_words)
                             for sel in self.fresh_after]

    def _base_regions(self) -> None:
        """The verdicts of every region made of one token's representative, no junction: what the
        region is right after a pre-token boundary (``"``, `` x``, ``\n  ``, ...), so nearly every
        region a request meets first; ~5 ms each in the compiled judge (Llama-3: 397 regions, 1.9 s,
        0.4 MB), loaded from the disk cache after the first build (~4 ms). With them, the regions of
        a lone space followed by whitespace that may join it (:meth:`_space_regions`)."""
        from .tokenizer_cache import cached_region_verdicts

        reps = sorted({outside_contractions(r) for r, tl in zip(self.sig_rep, self.sig_tail) if not tl} | {""})
        keys = [(r, ()) for r in reps] + self._space_regions()
        names = [_region_name(k) for k in keys]
        parts = (self.spec.split_pattern or "", str(self.fold_case), *self.sig_rep, ",".join(map(str, self.sig_tail)),
                 *names)

        def build() -> dict:
            rows = np.zeros((len(keys), self.n_signatures), np.int8)
            for i, k in enumerate(keys):
                rows[i] = self.sig_verdicts(k)
            self._sig_verdicts.clear()
            enc = [r.encode("utf-8") for r in names]
            off = np.zeros(len(enc) + 1, np.int64)
            np.cumsum([len(e) for e in enc], out=off[1:])
            return {"keys": np.frombuffer(b"".join(enc), np.uint8).copy(), "key_off": off, "verdicts": rows}

        a = cached_region_verdicts(self.info, parts, build)
        data, off, rows = a["keys"].tobytes(), a["key_off"], a["verdicts"]
        if rows.shape != (len(off) - 1, self.n_signatures):
            return
        for i in range(rows.shape[0]):
            v = np.ascontiguousarray(rows[i])
            if (v >= 0).all():      # complete (never written again)
                self._base_verdicts[_region_of_name(data[off[i]:off[i + 1]].decode("utf-8"))] = v
        self._sig_verdicts.update(self._base_verdicts)

    def _space_regions(self) -> list:
        """The regions of a lone space token followed by a whitespace token ending in a space or a
        tab (``' '`` + ``'  '``): Llama-3 and Qwen cut digits from the space before them, so ``' '``
        alone is the region before every number after ``": "``, and where the grammar allows more
        whitespace there the one-step lookahead reads each such token after it (its row of what may
        follow canonically: :meth:`CanonicalState._first_after`, ~3 ms a region not judged before;
        39 of them were ~12 us a mask of the MaskBench sample's first pass). Llama-3: 42 regions
        (runs of one class share a representative)."""
        u = self.token_of_bytes.get(b" ")
        if u is None or not self.n_narrow:
            return []
        tb = self.info.token_bytes
        wsb = _WS_BYTES
        st = CanonicalState(self)
        out = {}
        for w in np.flatnonzero(self.narrow_index >= 0).tolist():
            if not all(c in wsb for c in tb[w]):
                continue
            st.reset()
            st.push(u)
            st.push(w)
            if not st.pending:
                k = st._region()
                if k[1]:
                    out[k] = None
        return list(out)

    def _load_kernels(self) -> None:
        """Load (the first time on a machine: compile, then cached on disk) the kernels of the
        per-request side now, not in a request's first masks: ~10 ms, where a request's masks take
        tens of microseconds."""
        words = np.zeros(self.n_words, np.uint32)
        self.one_first_byte(words)
        _and_allowed(words, words, words, words)
        ok, need = np.zeros(self.n_words, np.uint32), np.zeros(self.n_words, np.uint32)
        _verdict_words(np.full(self.n_signatures, -1, np.int8), self.sig_of, self._plain_ids, ok, need)
        reach = np.flatnonzero(self.bpe.reach[: self.vocab_size])
        if reach.shape[0]:
            t = int(reach[0])
            self.bpe.pair_ok(t, t)
            self.bpe.conflict_words(t, self.n_words)

    def _build_forced_tables(self) -> None:
        """What :func:`~.canonical_split.forced_verdicts` reads (with a compiled split program): each
        ASCII byte's code in the program's alphabet (-1 for other bytes) and the program's
        :func:`~.canonical_split.bigrams`; its kernel is loaded now. ``_fv_code`` None: no such
        verdicts (the forced-text searches decide alone)."""
        from . import canonical_split as cs

        self._fv_code = self._fv_pair = self._fv_la = None
        if self._prog is None:
            return
        code = np.full(256, -1, np.int8)
        for b in range(128):
            r = rep_of(chr(b), self.fold_case)
            if len(r) == 1 and r in _SIGMA_CODE:
                code[b] = _SIGMA_CODE[r]
        self._fv_code = code
        self._fv_pair = cs.bigrams(self._prog)
        self._fv_la = np.int64(cs.lookahead_before(self._prog))
        z = np.zeros(0, np.int64)
        self.forced_verdicts(z, z, z, np.zeros((0, 1), np.uint8), np.zeros((0, 8), np.uint32))

    def forced_verdicts(self, region_ids: np.ndarray, hit: np.ndarray, flen: np.ndarray, fbuf: np.ndarray,
                        nxt: np.ndarray) -> np.ndarray | None:
        """:func:`~.canonical_split.forced_verdicts` of candidates ``hit`` followed by forced text
        ``fbuf[j, :flen[j]]`` and then a byte of ``nxt[j]``, after the open region of tokens
        ``region_ids`` (no unfinished character); None without a compiled split program."""
        if self._fv_code is None:
            return None
        bpe = self.bpe
        data, off, _rank = self.info.token_bytes_flat()
        out = np.empty(hit.shape[0], np.int64)
        _forced_verdicts(region_ids, hit, flen, fbuf, nxt, data, off, self._fv_code, self._fv_pair, self._fv_la,
                         bpe.byte_id, bpe.keys, bpe.rule_rank, bpe.rule_out, np.int64(bpe.V), out, *self._prog)
        return out

    # -------------------------------------------------------------- build
    @classmethod
    def from_info(cls, info, **kw) -> "CanonicalTokenizer":
        spec = canonical_spec(info, **kw)
        from .tokenizer_cache import cached_bpe_canon

        bpe = cached_bpe_canon(info, spec)
        return cls(info, spec, bpe)

    def _build_signatures(self):
        V = self.vocab_size
        tb = self.info.token_bytes
        sig_of = np.full(V, -1, np.int32)
        kind = np.zeros(V, np.int8)      # 0: plain, 1: starts inside a character
        tail = np.zeros(V, np.int8)      # trailing bytes of an unfinished character
        sigs: dict[tuple, int] = {}
        self.sig_rep: list[str] = []
        #: per signature: 0, or for a token ending inside a character, the probes that character
        #: may stand for (:func:`tail_probes`)
        self.sig_tail: list[int] = []
        self.raw_tokens: list[int] = []  # tokens starting with continuation bytes (judged on real bytes)
        reach = self.bpe.reach
        for t in range(V):
            b = tb[t]
            if not b or not reach[t]:
                continue
            lead, tl = _utf8_split(b)
            if lead:
                kind[t] = 1
                tail[t] = tl
                self.raw_tokens.append(t)
                continue
            body = b[: len(b) - tl] if tl else b
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                continue   # invalid UTF-8 inside: no text the grammar accepts contains it
            tp = tail_probes(b[len(b) - tl:]) if tl else 0
            if tl and not tp:
                continue   # an unfinished character that no byte completes: likewise
            key = (rep_of(text, self.fold_case), tp)
            s = sigs.get(key)
            if s is None:
                s = sigs[key] = len(self.sig_rep)
                self.sig_rep.append(key[0])
                self.sig_tail.append(key[1])
            sig_of[t] = s
            tail[t] = tl
        self.sig_of = sig_of
        self.kind = kind
        self.tail = tail
        self.raw_tokens = np.array(self.raw_tokens, np.int64)
        self.n_signatures = len(self.sig_rep)
        plain = sig_of >= 0
        self._plain_ids = np.nonzero(plain)[0]

    def _compile_judge(self, pattern: str) -> None:
        from . import canonical_split as cs

        prog = cs.compile_split(pattern)
        if prog is None:
            return
        width = max([len(r) for r in self.sig_rep] + [1])
        cand = np.zeros((self.n_signatures, width), np.int8)
        clen = np.zeros(self.n_signatures, np.int64)
        for i, r in enumerate(self.sig_rep):
            cand[i, : len(r)] = cs.encode(r)
            clen[i] = len(r)
        pw = max(len(f) for f in PROBES)
        probes = np.zeros((len(PROBES), max(pw, 1)), np.int8)
        plen = np.zeros(len(PROBES), np.int64)
        for i, f in enumerate(PROBES):
            probes[i, : len(f)] = cs.encode(f)
            plen[i] = len(f)
        assert PROBES[0] == ""   # judge_all skips probe 0 (end of text) for candidates ending mid-character
        self._prog = prog
        self._judge_args = (cand, clen, np.array(self.sig_tail, np.int64), probes, plen)
        # load (or, the first time on a machine, compile: seconds, then cached on disk) the kernels
        # now, not in a request's first mask; the empty region's verdicts come with it
        self.sig_verdicts(("", ()))
        self._probe_bits("x")
        self._boundaries("x")

    def _judge_compiled(self, region: str, junctions: tuple, todo: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Verdicts of the signatures ``todo`` after ``region`` in one compiled call (into ``v``);
        returns those it left to the Python judge (strings too long for its bit sets)."""
        from . import canonical_split as cs

        try:
            codes = cs.encode(region)
        except KeyError:        # not a representative string: the Python judge
            return todo
        jbits = bad = 0
        for p, ok in junctions:
            if p >= 63:
                return todo
            jbits |= 1 << p
            if not ok:
                bad |= 1 << p
        out = np.full(self.n_signatures, -1, np.int8)
        cand, clen, ctail, probes, plen = self._judge_args
        cs.judge_all(codes, np.int64(jbits), np.int64(bad), todo, cand, clen, ctail, probes, plen, out, *self._prog)
        got = out[todo]
        v[todo] = got
        return todo[got < 0]

    # -------------------------------------------------------------- pre-tokenizer on representatives
    def boundaries(self, s: str) -> frozenset:
        """Pre-token boundaries of a representative string (positions, 0 excluded), memoised."""
        hit = self._bounds.get(s)
        if hit is None:
            hit = frozenset(self._boundaries(s))
            if len(self._bounds) > 200_000:
                self._bounds.clear()
            self._bounds[s] = hit
        return hit

    def _boundaries(self, s: str) -> set[int]:
        if not s:
            return set()
        if self.pre is None:
            return set()
        if self._prog is not None:
            from .canonical_split import boundaries_bits

            try:
                bits = boundaries_bits(self._prog, s)
            except KeyError:    # not a representative string (or too long): the regex
                pass
            else:
                return {p for p in range(bits.bit_length()) if (bits >> p) & 1}
        return self._raw_boundaries(s)

    def _raw_boundaries(self, s: str) -> set[int]:
        """Pre-token boundaries of any string: the split regex, else the pre-tokenizer itself."""
        if self.pre is None:
            return set()
        out = set()
        if self._split is not None:
            for m in self._split.finditer(s):
                out.add(m.start())
                out.add(m.end())
        else:
            for _, (a, b) in self.pre.pre_tokenize_str(s):
                out.add(a)
                out.add(b)
        out.discard(0)
        return out

    def judge(self, region: str, junctions: tuple, cand: str, cand_tail, cut_inside: int = 0) -> int:
        """Verdict (OK / NEED_PAIR / REJECT) for appending a token of representative ``cand`` to the
        open region (``junctions``: (position, pair_ok) of the token junctions inside it).
        ``cand_tail``: the token ends inside a character, which the probes of this mask (bits over
        :data:`PROBES`, :func:`tail_probes`; True: any) stand for; 0/False: it does not."""
        w = region + cand
        r = len(region)
        end = len(w)
        best = REJECT
        probes = _tail_probe_list(cand_tail) if cand_tail else PROBES
        if r and not cand_tail:
            # what no future can change: the boundaries before the start of the last pre-token
            # (under the empty future). A junction there that is no boundary can only pass the
            # pair test; a boundary there inside the candidate or off the junctions rejects.
            b0 = self.boundaries(w)
            last = max((p for p in b0 if p < end), default=0)
            fixed = {p for p in b0 if p < last}
            if r < last and r not in fixed:
                if any(r < p < end for p in fixed) or not self._consistent_upto(fixed, r, junctions, last):
                    return REJECT
                probes = [f for f in probes if not f] + [f for f in probes if f]
                for f in probes:
                    bs = self.boundaries(w + f)
                    if self._consistent(bs, r, junctions) and not any(r < p < end for p in bs):
                        return NEED_PAIR
                return REJECT
        for f in probes:
            bs = self.boundaries(w + f)
            if not self._consistent(bs, r, junctions):
                continue
            # no boundary strictly inside the candidate (a boundary right before an unfinished
            # last character is inside it too)
            hi = end + (1 if cand_tail else 0)
            if any(r < p < hi for p in bs):
                continue
            if r == 0 or r in bs:
                return OK
            best = NEED_PAIR
        return best

    def judge_inside(self, region: str, junctions: tuple, cand: str, cand_tail: bool) -> int:
        """Verdict for a token that starts inside the region's unfinished last character: every
        boundary up to the candidate's end must be a junction (the one before that character
        included), and the pair test always applies."""
        w = region + cand
        hi = len(w) + (1 if cand_tail else 0)
        jpos = {p for p, _ in junctions}
        for f in (_tail_probe_list(cand_tail) if cand_tail else PROBES):
            bs = self.boundaries(w + f)
            if not self._consistent(bs, len(region), junctions):
                continue
            if any(len(region) <= p < hi and p not in jpos for p in bs):
                continue
            return NEED_PAIR
        return REJECT

    @staticmethod
    def _consistent(bs: set[int], r: int, junctions: tuple) -> bool:
        jpos = {p for p, _ in junctions}
        for p in bs:
            if 0 < p < r and p not in jpos:
                return False
        for p, ok in junctions:
            if not ok and p not in bs:
                return False
        return True

    @staticmethod
    def _consistent_upto(fixed: set, r: int, junctions: tuple, last: int) -> bool:
        jpos = {p for p, _ in junctions}
        if any(0 < p < r and p not in jpos for p in fixed):
            return False
        return all(ok or p in fixed for p, ok in junctions if p < last)

    def end_ok(self, region: str, junctions: tuple) -> bool:
        """The region may end the text here (a stop token)."""
        return self._consistent(self.boundaries(region), len(region), junctions)

    # -------------------------------------------------------------- verdict bitsets per region
    def region_words(self, key: tuple) -> tuple[np.ndarray, np.ndarray]:
        """(ok_words, need_pair_words) over the plain tokens for the region ``key`` =
        (representative, junctions)."""
        hit = self.cached_region_words(key)
        if hit is not None:
            return hit
        region, junctions = key
        v = self.sig_verdicts(key)
        ok = np.zeros(self.n_words, np.uint32)
        need = np.zeros(self.n_words, np.uint32)
        _verdict_words(v, self.sig_of, self._plain_ids, ok, need)
        self._lru_put(self._verdicts, key, (ok, need), self.max_cached_regions, "region_misses")
        return ok, need

    def _lru_get(self, table, key, stat: str):
        """``table[key]`` (an LRU ``OrderedDict``: marked recently used, ``stat`` counted) or None."""
        hit = table.get(key)        # no lock on a hit: each of these calls is atomic under the GIL
        if hit is not None:
            try:
                table.move_to_end(key)
            except KeyError:        # dropped by another thread's put meanwhile: still a valid answer
                pass
            self.stats[stat] += 1
        return hit

    def _lru_put(self, table, key, value, limit: int, stat: str) -> None:
        """Store ``value`` in the LRU ``table`` (oldest entries dropped past ``limit``; ``stat`` counted)."""
        with self._lock:
            self.stats[stat] += 1
            table[key] = value
            while len(table) > limit:
                table.popitem(last=False)

    def _build_lookups(self) -> None:
        """Tables the per-request side reads (built with the rest of the tokenizer side, not in a
        request's first masks: 80-140 ms for Llama-3's 128k tokens)."""
        tb = self.info.token_bytes
        reach = np.flatnonzero(self.bpe.reach[: self.vocab_size]).tolist()
        #: bytes -> id of the tokens that may occur in a canonical sequence
        self.token_of_bytes = tob = {tb[t]: t for t in reach if tb[t]}
        self.max_token_len = max((len(b) for b in tob), default=0)
        # (token bytes in increasing order, their ids): prefix_range
        keys = sorted(tob)
        self._sorted_tokens = (keys, np.array([tob[k] for k in keys], np.int64))
        #: each token's length in bytes (from the tokenizer's flat byte array)
        self.token_len = np.diff(self.info.token_bytes_flat()[1])
        # (first byte of each token, -1 for none; per byte, the bitmask of the tokens starting with it)
        first = np.array([b[0] if b else -1 for b in tb[: self.vocab_size]], np.int16)
        ids = np.flatnonzero(first >= 0)
        words = np.zeros((256, self.n_words), np.uint32)
        np.bitwise_or.at(words, (first[ids].astype(np.int64), ids >> 5),
                         np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
        self._first_bytes = (first, words)
        # tokens of whitespace alone ending in a space or a tab: the last whitespace before a word
        # or a sign joins it in a pre-token, so what may follow them canonically is narrow (digits,
        # the end): CanonicalState.prune_dead_ends reads what the grammar allows after them
        wsb = _WS_BYTES
        ws = [t for t in reach if tb[t] and all(c in wsb for c in tb[t])]
        nar = np.array([t for t in ws if tb[t][-1] in (0x20, 0x09)], np.int64)
        self.narrow_words = _words_of(nar, self.n_words)
        #: tokens of whitespace alone (left out where CanonicalState reads a wide mask's candidates)
        self.ws_words = _words_of(np.array(ws, np.int64), self.n_words)
        #: token id -> its index among the narrow tokens (-1: not one)
        self.narrow_index = np.full(self.vocab_size, -1, np.int64)
        self.narrow_index[nar] = np.arange(len(nar))
        self.n_narrow = len(nar)
        #: the state after a narrow token (region key, token, pending) -> (first bytes of the
        #: tokens canonical after it, as 8 words; whether the text may end there); and per state
        #: before it (region key, last, pending), a table over the narrow tokens of the same
        #: (first bytes [n, 8], may end [n], known [n], fresh [n], fresh as vocabulary bits): see
        #: CanonicalState._first_after; at most MAX_FIRST_TABLES tables (~12 KB each on Llama-3),
        #: then cleared
        self._first_after: dict = {}
        self._first_tables: dict = {}

    def one_first_byte(self, words: np.ndarray) -> bool:
        """Do all the tokens of the (non-empty) mask ``words`` start with one byte?"""
        first, fw = self._first_bytes
        return bool(_one_first_byte(words, first, fw))

    def prefix_range(self, prefix: bytes) -> tuple[int, int]:
        """Where the tokens whose bytes start with ``prefix`` (itself included) lie in
        ``_sorted_tokens`` (byte order)."""
        import bisect

        keys = self._sorted_tokens[0]
        lo = bisect.bisect_left(keys, prefix)
        up = prefix.rstrip(b"\xff")
        hi = len(keys) if not up else bisect.bisect_left(keys, up[:-1] + bytes([up[-1] + 1]))
        return lo, hi

    def cached_region_words(self, key: tuple):
        return self._lru_get(self._verdicts, key, "region_hits")

    def sig_verdicts(self, key: tuple, sigs=None) -> np.ndarray:
        """Verdict per signature for the region ``key`` (-1: not computed yet); computes those of
        ``sigs`` (default: all) that are missing."""
        v = self._sig_verdicts.get(key)
        if v is None:
            if len(self._sig_verdicts) > self.max_cached_regions + len(self._base_verdicts):
                self._sig_verdicts.clear()
                self._sig_verdicts.update(self._base_verdicts)
            v = self._sig_verdicts[key] = np.full(self.n_signatures, -1, np.int8)
        region, junctions = key
        todo = np.arange(self.n_signatures) if sigs is None else np.asarray(sigs, np.int64)
        todo = todo[v[todo] < 0]
        if self._prog is not None and len(todo):
            todo = self._judge_compiled(region, junctions, todo, v)
        for s in todo.tolist():
            v[s] = self.judge(region, junctions, self.sig_rep[s], self.sig_tail[s])
        return v

    def cut_index(self, key: tuple) -> int:
        """Index of the last junction of the region at which no future can move the
        pre-tokenization (every probe has a boundary there and agrees before it); -1: none."""
        c = self._cuts.get(key)
        if c is None:
            region, junc = key
            bits = self._probe_bits(region)
            if bits is not None:    # the same test on bit sets
                within = (1 << (len(region) + 1)) - 1
                bits = [b & within for b in bits]
                c = -1
                for i, (p, _) in enumerate(junc):
                    if all((b >> p) & 1 for b in bits):
                        upto = (1 << (p + 1)) - 1
                        if all(b & upto == bits[0] & upto for b in bits):
                            c = i
            else:
                sets = [{p for p in self.boundaries(region + f) if p <= len(region)} for f in PROBES]
                c = -1
                for i, (p, _) in enumerate(junc):
                    if all(p in x for x in sets):
                        before = [{q for q in x if q <= p} for x in sets]
                        if all(x == before[0] for x in before):
                            c = i
            if len(self._cuts) > 100_000:
                self._cuts.clear()
            self._cuts[key] = c
        return c

    def _probe_bits(self, region: str):
        """Boundaries of ``region + f`` for every probe ``f`` as ints of bits (one compiled call),
        or None where the compiled program cannot take the region."""
        if self._prog is None:
            return None
        from . import canonical_split as cs

        try:
            codes = cs.encode(region)
        except KeyError:
            return None
        if len(codes) + 2 > cs.MAX_LEN:
            return None
        _, _, _, probes, plen = self._judge_args
        out = np.zeros(len(PROBES), np.int64)
        cs.probe_bounds(codes, probes, plen, out, *self._prog)
        return [int(b) for b in out]

    def conflict_words(self, a: int) -> np.ndarray:
        hit = self._lru_get(self._conflicts, a, "conflict_hits")
        if hit is not None:
            return hit
        w = self.bpe.conflict_words(a, self.n_words)
        self._lru_put(self._conflicts, a, w, self.max_cached_conflicts, "conflict_misses")
        return w


_NO_CONFLICTS: dict = {}


def _region_name(key: tuple) -> str:
    """A region key (representative, junctions) as one string (the disk cache's key)."""
    rep, junc = key
    return rep if not junc else rep + "\x00" + ",".join(f"{p}:{int(ok)}" for p, ok in junc)


def _region_of_name(name: str) -> tuple:
    """:func:`_region_name` inverted."""
    rep, sep, rest = name.partition("\x00")
    if not sep:
        return (rep, ())
    return (rep, tuple((int(p), bool(int(ok))) for p, ok in (x.split(":") for x in rest.split(","))))


def _ids_of(words: np.ndarray, limit: int):
    """Ids of the set bits of ``words``, or None when more than ``limit`` words are non-zero
    (cheap on a wide mask: only the non-zero words are expanded)."""
    limit = min(int(limit), words.shape[0])
    out = np.empty(32 * max(limit, 1), np.int64)
    n = _ids_of_words(words, limit, out)
    return None if n < 0 else out[:n]


def canonical_tokenizer(info, **kw) -> CanonicalTokenizer:
    """The :class:`CanonicalTokenizer` of ``info``, built once and kept on it."""
    ct = getattr(info, "_canonical", None)
    if ct is None or kw:
        ct = CanonicalTokenizer.from_info(info, **kw)
        if not kw:
            info._canonical = ct
    return ct


class PackedDrops:
    """Many dropped tokens as the words they fall in (``idx``) and each word's mask of what stays
    (``keep``): a memo hit applies them with one indexed AND, not a scalar update per token."""

    __slots__ = ("idx", "keep", "n")

    def __init__(self, drops):
        gone: dict = {}
        for t in drops:
            gone[t >> 5] = gone.get(t >> 5, 0) | (1 << (t & 31))
        self.idx = np.fromiter(gone.keys(), np.int64, len(gone))
        self.keep = ~np.fromiter(gone.values(), np.uint32, len(gone))
        self.n = len(drops)

    def __len__(self):
        return self.n


class LookaheadMemo:
    """What :meth:`CanonicalState.prune_dead_ends` dropped, per grammar state
    (:meth:`.GrammarMatcher.state_key`) and canonical state (region key, last token, pending
    bytes), for one lexer generation of one grammar and one set of lookahead settings (kept on
    the generation, counted by its :meth:`.Lexer.held_bytes`). The lookahead's outcome is a
    function of those alone: the grammar's answers depend on its state, the canonical ones on
    the region (as :attr:`CanonicalTokenizer._forced_verdicts` assumes), the searches on the
    settings. A schema served again meets the same states (the same keys in the same order,
    other values), and so does each element of an array after the first: the searches after a key
    or before a forced value then cost a dict lookup.
    Bounded by :attr:`max_bytes` (cleared when full)."""

    #: bytes (estimated) past which the memo is cleared
    max_bytes = 8 << 20
    #: estimated bytes per entry besides its key's row bytes and its tokens
    entry_bytes = 400

    def __init__(self):
        self.entries: dict = {}
        self.nbytes = 0
        self.hits = self.misses = 0
        self._lock = threading.Lock()

    def get(self, key):
        hit = self.entries.get(key)
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def put(self, key, drops: tuple) -> None:
        size = self.entry_bytes + len(key[0][0]) + 36 * len(drops)
        with self._lock:
            if self.nbytes + size > self.max_bytes:
                self.entries.clear()
                self.nbytes = 0
            self.entries[key] = drops
            self.nbytes += size


# ---------------------------------------------------------------------------------------------- per request
class CanonicalState:
    """The per-matcher state: the open region (token ids, their bytes and junction pair bits) and
    a history for rollback."""

    def __init__(self, ct: CanonicalTokenizer):
        self.ct = ct
        self.reset()

    def reset(self):
        self.tokens: tuple = ()        # the tokens of the open region
        self.pair_ok: tuple = ()       # pair bit of each junction between them
        self.last = -1
        self.pending = b""             # bytes of an unfinished character at the end
        self._hist: list = []
        self._key = None

    def copy(self) -> "CanonicalState":
        n = object.__new__(CanonicalState)
        n.__dict__.update(self.__dict__)
        n._hist = list(self._hist)
        return n

    # the region as (representative, junctions)
    def _region(self) -> tuple[str, tuple]:
        """(representative of the region's complete characters, junctions): each character belongs
        to the token it starts in; a junction inside a character is not a junction (no boundary
        can fall there; its pair bit was required when the token was accepted)."""
        if self._key is None:
            # a pure function of (tokens, pair bits, pending bytes): memoised per tokenizer
            memo = self.ct._regions
            mk = (self.tokens, self.pair_ok, self.pending)
            hit = memo.get(mk)
            if hit is not None:
                self._key, self._jtok = hit
                return self._key
            tb = self.ct.info.token_bytes
            text = b"".join(tb[t] for t in self.tokens)
            if self.pending:
                text = text[: len(text) - len(self.pending)]
            ascii_ = text.isascii()     # the common case: a character per byte
            # a byte that is no character (none in a text the grammar accepts) is one lone
            # surrogate; a real U+FFFD in the text keeps its three bytes
            s = text.decode("ascii") if ascii_ else text.decode("utf-8", "surrogateescape")
            starts, off = [], 0
            if not ascii_:
                for c in s:
                    starts.append(off)
                    off += 1 if "\udc80" <= c <= "\udcff" else len(c.encode("utf-8"))
            n_s = len(s)
            # junctions inside a letter run or a punctuation run (no apostrophe around) that pass
            # the pair test constrain nothing (no pre-token boundary can fall there): merged away,
            # so a long word keeps a short representative
            merge_ok = "'" not in s
            segs: list[list] = []      # [text, pair bit of the junction before it]
            jtok: list[int] = []
            pos, ci = 0, 0
            for i, t in enumerate(self.tokens):
                a, pos = pos, pos + len(tb[t])
                if ascii_:
                    sub = s[a:pos]
                    at_char = a < n_s or a == len(text)
                else:
                    c0 = ci
                    while ci < len(starts) and starts[ci] < pos:
                        ci += 1
                    sub = s[c0:ci]
                    at_char = (c0 < len(starts) and starts[c0] == a) or a == len(text)
                if i and at_char and segs:
                    ok = bool(self.pair_ok[i - 1])
                    prev = segs[-1][0][-1:] if segs[-1][0] else ""
                    nxt = sub[:1]
                    if ok and merge_ok and prev and nxt and _char_class(prev) == _char_class(nxt) in ("L", "."):
                        segs[-1][0] += sub
                        continue
                    segs.append([sub, ok])
                    jtok.append(i)
                elif segs:
                    segs[-1][0] += sub
                else:
                    segs.append([sub, True])
            rep, junc = "", []
            for k, (txt, ok) in enumerate(segs):
                if k:
                    junc.append((len(rep), ok))
                rep += rep_of(txt, self.ct.fold_case)
            self._key = (outside_contractions(rep), tuple(junc))
            self._jtok = jtok
            if len(memo) > 100_000:
                memo.clear()
            memo[mk] = (self._key, jtok)
        return self._key

    def allowed_words(self, words: np.ndarray) -> int:
        """AND the canonical condition into ``words`` (the grammar's mask of the next token).
        Returns how many words it left non-zero where the AND counted them, else -1."""
        ct = self.ct
        if self.pending:
            self._raw_filter(words)
            return -1
        key = self._region()
        hit = ct.cached_region_words(key)
        if hit is None:
            ids = _ids_of(words, ct.lazy_limit)
            if ids is not None and len(ids) <= ct.lazy_limit:
                self._lazy_filter(words, key, ids)
                return -1
            hit = ct.region_words(key)
        ok, need = hit
        if self.last >= 0 and self.tokens:
            conf = ct.conflict_words(self.last)
        else:
            conf = _NO_CONFLICTS.get(ok.shape[0])
            if conf is None:
                conf = _NO_CONFLICTS[ok.shape[0]] = np.zeros(ok.shape[0], np.uint32)
        return _and_allowed(words, ok, need, conf)

    def _lazy_filter(self, words: np.ndarray, key: tuple, ids: np.ndarray) -> None:
        """The verdicts of only the signatures of the tokens the grammar allows (a small mask on
        a region not seen before: forced or enumerated text)."""
        ct = self.ct
        sigs = ct.sig_of[ids]
        valid = sigs >= 0
        v = ct.sig_verdicts(key, np.unique(sigs[valid]).tolist())
        tv = np.full(len(ids), REJECT, np.int8)
        tv[valid] = v[sigs[valid]]
        keep = tv == OK
        need = tv == NEED_PAIR
        if need.any():
            if self.last >= 0 and self.tokens:
                conf = ct.conflict_words(self.last)
                cbit = (conf[ids >> 5] >> (ids & 31).astype(np.uint32)) & np.uint32(1)
                keep |= need & (cbit == 0)
            else:
                keep |= need
        words[:] = 0
        k = ids[keep]
        np.bitwise_or.at(words, k >> 5, np.left_shift(np.uint32(1), (k & 31).astype(np.uint32)))

    def _raw_filter(self, words: np.ndarray) -> None:
        """After an unfinished character: only tokens starting with continuation bytes fit; each is
        judged on its real bytes (few tokens)."""
        ct = self.ct
        keep = np.zeros_like(words)
        for t in ct.raw_tokens:
            t = int(t)
            if not (words[t >> 5] >> np.uint32(t & 31)) & 1:
                continue
            if self.allows(t):
                keep[t >> 5] |= np.uint32(1 << (t & 31))
        words[:] = keep

    def allows(self, t: int) -> bool:
        ct = self.ct
        tb = ct.info.token_bytes
        b = tb[t]
        if not b or not ct._reach_b[t]:
            return False
        if bool(self.pending) != bool(ct._lead_b[t]):
            return False
        region, junc = self._region()
        if self.pending:
            whole = self.pending + b
            tl = _utf8_split(whole)[1]
            body = whole[: len(whole) - tl] if tl else whole
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                return False
            # the pending character belongs to the previous token: the junction is inside it
            cand = rep_of(text, ct.fold_case)
            tp = tail_probes(whole[len(whole) - tl:]) if tl else 0
            if tl and not tp:
                return False
            v = ct.judge_inside(region, junc, cand, tp)
        else:
            s = ct._sig_a[t]
            if s < 0:
                return False
            sv = ct._sig_verdicts.get((region, junc))
            v = -1 if sv is None else int(sv[s])
            if v < 0:
                v = int(ct.sig_verdicts((region, junc), (s,))[s])   # this signature only (lookahead: many regions)
        if v == OK:
            return True
        if v == NEED_PAIR:
            return self.last < 0 or not self.tokens or ct.bpe.pair_ok(self.last, t)
        return False

    def can_end(self) -> bool:
        if self.pending:
            return False
        region, junc = self._region()
        return self.ct.end_ok(region, junc)

    def push(self, t: int) -> None:
        ct = self.ct
        self._hist.append((self.tokens, self.pair_ok, self.last, self.pending, self._key,
                           getattr(self, "_jtok", None)))
        b = ct.info.token_bytes[t]
        pok = True if not self.tokens else ct.bpe.pair_ok(self.last, t)
        tokens = self.tokens + (t,)
        pair = self.pair_ok + ((pok,) if self.tokens else ())
        tl = _utf8_split(self.pending + b)[1] if self.pending else ct._tail_b[t]
        self.pending = (self.pending + b)[-tl:] if tl else b""
        self.tokens, self.pair_ok, self.last, self._key = tokens, pair, t, None
        self._settle()

    def pop(self) -> None:
        self.tokens, self.pair_ok, self.last, self.pending, self._key, self._jtok = self._hist.pop()

    def push_marker(self) -> None:
        """A step that changes nothing here (a stop token), kept for rollback."""
        self._hist.append((self.tokens, self.pair_ok, self.last, self.pending, self._key,
                           getattr(self, "_jtok", None)))

    def push_text(self) -> None:
        """Raw text accepted with ``accept_string``: not tokens, so the next token starts afresh
        (as after a pre-token boundary)."""
        self.push_marker()
        self.tokens, self.pair_ok, self.last, self.pending, self._key = (), (), -1, b"", None

    _in_lookahead = False
    #: False: no lookahead at all (the mask is then the per-step canonical condition only)
    lookahead = True
    #: the grammar-driven lookahead of :meth:`prune_dead_ends` runs on masks of at most this many
    #: tokens, this deep, computing at most this many masks per call
    lookahead_limit = 8
    lookahead_depth = 3
    lookahead_budget = 24

    #: keep what :meth:`prune_dead_ends` drops per grammar and canonical state
    #: (:class:`LookaheadMemo`)
    memoise = True

    def prune_dead_ends(self, matcher, words: np.ndarray, nz: int = -1) -> None:
        """Lookahead against dead ends: :meth:`_prune` where the mask is narrow enough, its
        verdicts kept per state (a lookahead's outcome is a function of the grammar state, the
        open region and the settings: kept in a :class:`LookaheadMemo` of the grammar's lexer
        generation, keyed by :meth:`.GrammarMatcher.state_key` and the region)."""
        if self._in_lookahead or not self.lookahead:
            return
        # a proper prefix of the forced text as a candidate needs two forced bytes or more, and
        # then every candidate starts with them: a wide mask has none (skip the forced-text call);
        # a mask over more than 512 words has neither that nor a candidate list to search
        if nz < 0:      # (``nz``: the non-zero words of ``words``, as restrict() returns them)
            nz = np.count_nonzero(words)
        narrow = None
        if self.narrow_lookahead:
            nw = self.ct.narrow_words
            if self.narrow_lookahead == "joined" and self.ct.joined_words is not None:
                # only the whitespace that may join the region before it (after whitespace)
                a = _last_code(self._region()[0], self.pending)
                if a is not None:
                    nw = self.ct.joined_words[a]
            if nw is not None:
                narrow = words & nw
                if not narrow.any():
                    narrow = None
        dp = self.ct._digit_probe
        if dp is not None and self.digit_lookahead and words.item(dp[0]) & dp[1] and \
                not words.item(dp[2]) & dp[3] and not _any_outside(words, self.ct.digit_words):
            # digits alone may come: the digits that must end a run, where the grammar may want
            # more digits (narrow candidates of their own)
            d = words & self.ct.digit_end_words
            if d.any():
                narrow = d if narrow is None else narrow | d
        # wide: only the narrow candidates are read (if any)
        wide = nz > 512 and nz > self.forced_after_words
        # (a mask of at most forced_after_wide_words words has its candidates read but whitespace)
        read = nz <= self.forced_after_wide_words
        if wide:
            if narrow is None and not read:
                return
            one = False
        else:
            # two forced bytes or more: every allowed token starts with the first (a stop token,
            # or two first bytes, and nothing is forced)
            one = nz <= 512 and self.ct.one_first_byte(words)
            if not one and nz > self.forced_after_words and nz > self.lookahead_limit and narrow is None and not read:
                # nothing to search: no forced text, nor the text forced after each candidate,
                # nor a candidate list (more non-zero words than the list may hold tokens)
                return
        memo = None
        if self.memoise:
            sk = matcher.state_key()
            if sk is not None:
                memo = self._memo_of(matcher)
                key = (sk, self._region(), self.last, self.pending)
                drops = memo.get(key)
                if drops is not None:
                    if type(drops) is tuple and len(drops) > 4:
                        # many (whitespace after the narrow lookahead): packed per word at the
                        # first hit (a miss that is never met again pays nothing for it)
                        drops = memo.entries[key] = PackedDrops(drops)
                    if type(drops) is tuple:
                        for t in drops:
                            words[t >> 5] &= ~np.uint32(1 << (t & 31))
                    else:
                        words[drops.idx] &= drops.keep
                    return
                self._dropped = []
        try:
            if wide:
                self._prune_forced_after(matcher, words, set(), narrow)
            else:
                self._prune(matcher, words, nz, narrow, one)
            if memo is not None:
                memo.put(key, tuple(self._dropped))
        finally:
            self._dropped = None

    #: the tokens :meth:`_prune` dropped, while :meth:`prune_dead_ends` records them (else None)
    _dropped = None

    def _drop(self, words: np.ndarray, t: int) -> None:
        """Drop token ``t`` from the mask ``words`` (recorded for the memo)."""
        words[t >> 5] &= ~np.uint32(1 << (t & 31))
        if self._dropped is not None:
            self._dropped.append(t)

    def _drop_many(self, words: np.ndarray, ts: list) -> None:
        """:meth:`_drop` of each token of ``ts`` (many at once: one indexed AND per word)."""
        if len(ts) <= 4:
            for t in ts:
                self._drop(words, t)
            return
        p = PackedDrops(ts)
        words[p.idx] &= p.keep
        if self._dropped is not None:
            self._dropped.extend(ts)

    def _memo_of(self, matcher) -> "LookaheadMemo":
        """The :class:`LookaheadMemo` of ``matcher``'s lexer generation for these settings."""
        lexer = matcher._lexer
        memos = lexer.__dict__.get("canonical_memos")
        if memos is None:
            memos = lexer.__dict__.setdefault("canonical_memos", {})
        cfg = (self.ct, self.lookahead_limit, self.lookahead_depth, self.lookahead_budget, self.forced_after_words,
               self.forced_after_wide_words, self.forced_after_bytes, self.narrow_lookahead, self.digit_lookahead,
               matcher._stop_set, matcher.terminate_without_stop_token)
        m = memos.get(cfg)
        if m is None:
            m = memos.setdefault(cfg, LookaheadMemo())
        return m

    def _prune(self, matcher, words: np.ndarray, nz: int, narrow, one: bool) -> None:
        """Lookahead against dead ends: drop a candidate after which no canonical continuation
        exists, e.g. ``{`` when the grammar forces ``"name"`` next and the tokenizer writes ``{"``
        as one token.

        1. Forced text ``F`` (the grammar's jump-forward bytes from here): a candidate that is a
           proper prefix of ``F`` must be followed by tokens spelling the rest of ``F`` (or a token
           running past its end), each canonical after the previous one: a search along ``F``
           (memoised per call; the grammar is asked only about a token running past the end).
           Longest candidate first: one that reaches a pre-token boundary no future moves is the
           canonical tokenization's token there, so the shorter ones are dropped unsearched.
        2. On masks of at most ``forced_after_words`` non-zero words, the same search along the
           text the grammar forces after each candidate (:meth:`_prune_forced_after`; up to
           ``forced_after_wide_words``, after each candidate that is not whitespace alone).
        3. Other small masks (at most ``lookahead_limit`` tokens): a depth-first search over the
           canonical masks of the grammar, ``lookahead_depth`` deep and ``lookahead_budget`` masks
           at most; a branch reaching a wider mask, the depth or the budget counts as viable.
        A candidate neither test can refute is kept (see the README: dead ends remain possible).
        ``nz``: the non-zero words of ``words`` (at most 512, or at most ``forced_after_words`` or
        ``forced_after_wide_words``);
        ``narrow``: its narrow candidates (:meth:`_prune_forced_after`), or None; ``one``: its
        tokens all start with one byte (and it has at most 512 words)."""
        forced = matcher.find_jump_forward_bytes(256) if one else b""
        checked = set()
        self._after_masks = {}
        if forced:
            ct = self.ct
            memo: dict = {}
            verdicts = ct._forced_verdicts
            self._matcher = matcher
            # verdicts that asked the grammar nothing are the tokenizer's alone: kept per tokenizer
            # (``memo`` is shared by the candidates, so none is kept once one asked)
            self._asked = False
            # longest first: a candidate found viable up to a pre-token boundary that no future
            # moves (CERTAIN) is the only one: the canonical tokenization of the text up to that
            # boundary is unique, and the shorter candidates all end before it
            unique = False
            cands = []
            for k in range(min(len(forced) - 1, ct.max_token_len), 0, -1):
                t = ct.token_of_bytes.get(forced[:k])
                if t is not None and (words[t >> 5] >> np.uint32(t & 31)) & 1:
                    cands.append((k, t))
            if cands:
                here = (self._region(), self.last, self.pending)
                keys = [(here, t, forced) for _k, t in cands]
                oks = [verdicts.get(key) for key in keys]
                miss = [i for i, ok in enumerate(oks) if ok is None]
                if miss:
                    # those whose forced text reaches a boundary no future moves: one compiled call
                    fv = self._boundary_verdicts_along(forced, [cands[i] for i in miss])
                    if fv is not None:
                        if len(verdicts) > 100_000:
                            verdicts.clear()
                        for i, v in zip(miss, fv):
                            if v >= 0:
                                oks[i] = verdicts[keys[i]] = CERTAIN if v == FV_VIABLE else False
            for i, (k, t) in enumerate(cands):
                checked.add(t)
                if unique:
                    self._drop(words, t)
                    continue
                ok = oks[i]
                if ok is None:
                    ok = self._search_after(t, forced, k, memo, keys[i])
                if not ok:
                    self._drop(words, t)
                elif ok == CERTAIN:
                    unique = True
            self._matcher = None
        if nz <= max(self.forced_after_words, self.forced_after_wide_words) or narrow is not None:
            self._prune_forced_after(matcher, words, checked, narrow)
        # more words than tokens the search may take (counted again: the searches above may
        # have dropped some)
        if nz > self.lookahead_limit and np.count_nonzero(words) > self.lookahead_limit:
            return
        cand = _ids_of(words, self.lookahead_limit)
        if cand is None or len(cand) == 0 or len(cand) > self.lookahead_limit:
            return
        stops = set(matcher.stop_token_ids)
        self._in_lookahead = True
        self._budget = self.lookahead_budget
        try:
            for t in cand:
                t = int(t)
                if t in stops or t in checked:
                    continue
                if not self._viable_after(matcher, t, self.lookahead_depth, words.shape[0], stops):
                    self._drop(words, t)
        finally:
            self._in_lookahead = False

    #: the bytes that may follow the forced text being searched (:meth:`_prune_forced_after`)
    _next_after = None
    #: the one-step lookahead after whitespace ending in a space or a tab (:meth:`_prune_forced_after`'s
    #: ``narrow``): ``"joined"`` (default) on the whitespace that may join the region before it
    #: (after whitespace: what every whitespace dead end of the walks but three was), where its
    #: rows depend on the region; True on every such token (after a letter or a sign too, where
    #: the rows are ``fresh`` but the grammar must step each long token, building lexer states
    #: the plain mask never needs: ~2.7x the plain mask on a first pass, docs/fast-forward.md
    #: section 10); False: off
    narrow_lookahead = "joined"
    #: the same one-step lookahead after the digits that must end a run of digits
    #: (:meth:`CanonicalTokenizer._build_digit_probes`) where the mask holds digits alone:
    #: ``20`` where a pattern wants four digits
    digit_lookahead = True
    #: :meth:`_prune_forced_after` runs on masks of at most this many non-zero words (a JSON
    #: value's first token, ~1,400 tokens, is a mask of ~1,000 words: left out. 16 until session
    #: 47: 39 -> 24 dead ends in the walks, first pass +0.05x; 512: +0.5x; docs/fast-forward.md
    #: section 11)
    forced_after_words = 256
    #: and on the candidates that are not whitespace alone of masks of at most this many (a
    #: key's first letters beside the whitespace allowed there; a JSON value's first token is a
    #: mask of ~1,000 words). Dead ends in the walks: 24 at 256, 9 at 384, 6 at 1024; a first
    #: pass costs 1.80x, 1.91x, 2.02-2.09x at 512 and 2.30-2.39x at 1024 (docs/fast-forward.md
    #: section 12)
    forced_after_wide_words = 384
    #: and looks this far into the text the grammar forces after a candidate
    forced_after_bytes = 24

    def _prune_forced_after(self, matcher, words: np.ndarray, checked: set, narrow=None) -> None:
        """Drop a candidate after which the grammar forces text that no canonical continuation
        spells: ``n`` where ``null`` is the only value left and ``null`` is one token (or merges
        with what came before), a key's first letters where the rest of the key is forced and
        BPE writes the whole key otherwise. Wide masks hold such candidates too (``n`` among the
        ~1,400 tokens a JSON value may begin with), so the forced text after every candidate comes
        from one compiled call (:meth:`.GrammarMatcher.forced_after_words`: most candidates stop
        at once, two bytes being readable after them); each candidate followed by forced text
        then gets the search along it of :meth:`_forced_viable` (the tokens spelling it, each
        canonical after the previous one, the last one possibly running past its end).

        ``narrow``: the candidates among :attr:`CanonicalTokenizer.narrow_words` (whitespace
        ending in a space), a one-step lookahead: dropped when no token canonical after them
        starts with a byte the grammar allows there (and the text may not end there). A mask
        wider than ``forced_after_words`` words has only these read and, up to
        ``forced_after_wide_words`` words, its candidates that are not whitespace alone."""
        nzw = np.count_nonzero(words)
        small = nzw <= self.forced_after_words
        # wider: the candidates that are not whitespace alone (and the narrow ones)
        read = not small and nzw <= self.forced_after_wide_words
        here = (self._region(), self.last, self.pending)
        known = None
        ct = self.ct
        if narrow is not None:
            tab = self._first_table(None, here)
            # the narrow candidates whose verdict the mask itself shows (short whitespace) or the
            # lexer state kept are not read again: neither the grammar's next bytes nor forced text
            if _narrow_witnessed(words, narrow, ct.narrow_index, tab[0], tab[2], ct.ext_bits, ct.ext_tok,
                                 matcher.narrow_live(words.shape[0]), tab[4]):
                known = (ct.narrow_index, *tab[:4])
            elif small or read:
                narrow = None
            else:
                return
        if small:
            sel = words
        elif read:
            sel = words & ~ct.ws_words
            if narrow is not None:
                sel |= narrow
        else:
            sel = narrow
        hit, flen, fbuf, nxt = matcher.forced_after_words(sel, self.forced_after_bytes, probe=narrow, known=known)
        if len(hit) == 0:
            return
        tb = self.ct.info.token_bytes
        memo = self.ct._forced_verdicts
        self._matcher = matcher
        try:
            # narrow candidates with nothing forced after them: decided by the kernel (-3: no
            # canonical continuation starts with a byte the grammar allows), or not known yet
            # (few hits: read as lists, not with numpy selections)
            fl, hl = flen.tolist(), hit.tolist()
            drop = [t for t, n in zip(hl, fl) if n == -3]
            if narrow is not None:
                probes = np.flatnonzero((flen == 0) | (flen == -2))
                if len(probes):
                    first, end = self._first_table(hit[probes], here)
                    live = (first & nxt[probes]).any(axis=1) | (end & (flen[probes] == -2))
                    drop += hit[probes[~live]].tolist()
            self._drop_many(words, [t for t in drop if t not in checked])
            width = fbuf.shape[1]
            todo = []
            for i, n in enumerate(fl):
                # -1 (rejected), 0/-2/-3 (probes): nothing to search
                if n <= 0:
                    continue
                t = hl[i]
                b = tb[t]
                if not b or t in checked:
                    continue
                tail = fbuf[i, :n].tobytes()
                # (text cut at the limit: its end is unknown, kept unless a boundary is found in it)
                todo.append((b + tail, -len(b), i, t, tail, n >= width))
            # the verdicts are the tokenizer's alone (given the bytes that may follow the forced
            # text) unless the grammar was asked about a token running past it: memoised per
            # tokenizer then; those not memoised whose forced text reaches a boundary no future
            # moves come from one compiled call (the rest are searched)
            keys = [(here, t, tail, nxt[i].tobytes()) for _x, _n, i, t, tail, _c in todo]
            oks = [memo.get(k) for k in keys]
            miss = [j for j, ok in enumerate(oks) if ok is None]
            if miss:
                if len(memo) > 100_000:
                    memo.clear()
                idx = np.array([todo[j][2] for j in miss], np.int64)
                fv = self._boundary_verdicts(hit[idx], flen[idx], fbuf[idx], nxt[idx])
                if fv is not None:
                    for j, v in zip(miss, fv):
                        if v >= 0:
                            oks[j] = memo[keys[j]] = CERTAIN if v == FV_VIABLE else False
            # candidates that spell prefixes of the same text (``n``, ``nu`` before a forced
            # ``null``): longest first, and once one reaches a pre-token boundary no future moves
            # (CERTAIN) the shorter ones are not canonical (as in prune_dead_ends' step 1)
            order = sorted(range(len(todo)), key=todo.__getitem__)
            certain = None
            for j in order:
                text, neg_len, i, t, tail, cut = todo[j]
                ok = oks[j]
                if ok is None and cut:
                    continue
                checked.add(t)
                if text == certain:
                    self._drop(words, t)
                    continue
                if ok is None:
                    self._next_after = nxt[i]
                    self._asked = False
                    ok = self._search_after(t, text, -neg_len, {}, keys[j])
                if not ok:
                    self._drop(words, t)
                elif ok == CERTAIN:
                    certain = text
        finally:
            self._matcher = self._next_after = None

    def _boundary_verdicts(self, hit, flen, fbuf, nxt):
        """:meth:`CanonicalTokenizer.forced_verdicts` after the open region, as a list (None after an
        unfinished character, or without a compiled split program)."""
        if self.pending or self.ct._fv_code is None:
            return None
        ids = self.__dict__.get("_region_ids")
        if ids is None or ids[0] is not self.tokens:
            ids = self._region_ids = (self.tokens, np.array(self.tokens, np.int64))
        out = self.ct.forced_verdicts(ids[1], hit, flen, fbuf, nxt)
        return out.tolist()

    def _boundary_verdicts_along(self, forced: bytes, cands: list):
        """:meth:`_boundary_verdicts` of candidates ``(k, t)``, token ``t`` spelling ``forced[:k]``, the
        rest of ``forced`` being forced after it (and then any byte): FV_VIABLE is CERTAIN here."""
        from .canonical_split import MAX_LEN

        width = min(len(forced), MAX_LEN)
        n = len(cands)
        hit = np.empty(n, np.int64)
        flen = np.empty(n, np.int64)
        fbuf = np.zeros((n, width), np.uint8)
        src = np.frombuffer(forced, np.uint8)
        for i, (k, t) in enumerate(cands):
            hit[i] = t
            m = min(len(forced) - k, width)
            flen[i] = m
            fbuf[i, :m] = src[k:k + m]
        return self._boundary_verdicts(hit, flen, fbuf, np.full((n, 8), 0xFFFFFFFF, np.uint32))

    def _first_table(self, toks, here: tuple):
        """:meth:`_first_after` of the narrow tokens ``toks`` (ids), as arrays ([n, 8] first
        bytes, [n] may end), from a table kept per ``here`` and per tokenizer; ``toks`` None:
        the table itself (first bytes, may end, known, fresh, fresh as vocabulary bits)."""
        ct = self.ct
        tab = ct._first_tables.get(here)
        if tab is None:
            n = max(ct.n_narrow, 1)
            if len(ct._first_tables) >= MAX_FIRST_TABLES:
                ct._first_tables.clear()
            tab = (np.zeros((n, 8), np.uint32), np.zeros(n, bool), np.zeros(n, bool), *ct.no_fresh)
            a = _last_code(here[0][0], here[2])
            if ct.fresh_after is not None and a is not None:
                # the narrow tokens that start at a boundary no future moves after this region:
                # the state after them is theirs alone (CanonicalTokenizer._build_fresh_rows)
                sel = ct.fresh_after[a]
                f, e, _k = ct.fresh
                tab = (tab[0], tab[1], tab[2], sel, ct.fresh_words[a])
                tab[0][sel] = f[sel]
                tab[1][sel] = e[sel]
                tab[2][sel] = True
            ct._first_tables[here] = tab
        if toks is None:
            return tab
        first, end, known = tab[:3]
        idx = ct.narrow_index[toks]
        for j in np.flatnonzero(~known[idx]).tolist():
            k = int(idx[j])
            first[k], end[k] = self._first_after(int(toks[j]))
            known[k] = True
        return first[idx], end[idx]

    def _first_after(self, t: int) -> tuple[np.ndarray, bool]:
        """(the first bytes of the tokens canonical after ``t``, as 8 words; whether the text may
        end after ``t``): the tokenizer's alone, kept per tokenizer under the state after ``t``
        (:meth:`_first_table` keeps it per state before ``t`` too)."""
        ct = self.ct
        memo = ct._first_after
        self.push(t)
        try:
            key = (self._region(), t, self.pending)
            hit = memo.get(key)
            if hit is None:
                w = np.full(ct.n_words, 0xFFFFFFFF, np.uint32)
                self.allowed_words(w)
                has = (ct._first_bytes[1] & w).any(axis=1)
                first = np.packbits(has, bitorder="little").view(np.uint32).copy()
                hit = (first, self.can_end())
                memo[key] = hit
        finally:
            self.pop()
        if len(memo) > 100_000:
            memo.clear()
        return hit

    def _search_after(self, t: int, forced: bytes, pos: int, memo: dict, key) -> bool:
        """:meth:`_forced_viable` after ``t`` (which spells ``forced[:pos]``, the rest being forced);
        the verdict is kept per tokenizer under ``key`` unless the grammar was asked since
        ``self._asked`` was last cleared."""
        self.push(t)
        self._commit_at = len(self._hist)
        try:
            ok = self._forced_viable(forced, pos, memo)
        finally:
            self.pop()
        if not self._asked:
            verdicts = self.ct._forced_verdicts
            if len(verdicts) > 100_000:
                verdicts.clear()
            verdicts[key] = ok
        return ok

    def _grammar_takes(self, data: bytes) -> bool:
        """Does the grammar accept ``data`` from the state the lookahead started in?"""
        return self._matcher.accepts_bytes(data)

    def _forced_viable(self, forced: bytes, pos: int, memo: dict) -> bool:
        """Can the (already pushed) token sequence, which spells ``forced[:pos]``, go on canonically
        with tokens spelling ``forced[pos:]`` (the last one may run past its end, if the grammar
        takes what it adds)?"""
        rest = forced[pos:]
        if len(self.tokens) <= len(self._hist) - self._commit_at:
            # the candidate left the open region: a boundary after it that no text can move, so
            # it stays canonical whatever follows (the rest has a canonical tokenization of its own);
            # CERTAIN: the tokens up to that boundary are the canonical tokenization of its text,
            # the only one (prune_dead_ends drops the other candidates then)
            return CERTAIN
        if not rest:
            return True
        key = (self._region(), self.last, self.pending, len(rest))
        hit = memo.get(key)
        if hit is not None:
            return hit
        ct = self.ct
        res = False
        for k in range(1, min(len(rest), ct.max_token_len) + 1):
            r = ct.token_of_bytes.get(rest[:k])
            if r is None or not self.allows(r):
                continue
            self.push(r)
            try:
                res = self._forced_viable(forced, pos + k, memo)
            finally:
                self.pop()
            if res:
                break
        if not res:
            res = self._overrun_viable(forced, pos)
        memo[key] = res
        return res

    def _overrun_viable(self, forced: bytes, pos: int) -> bool:
        """Is there a token running past the end of the forced text, from ``pos``, that is
        canonical after the tokens pushed and that the grammar takes? The canonical condition
        first, on the tokens starting with the rest's first byte at once (:meth:`allowed_words`);
        the grammar is asked only about the few left (``self._asked`` is set then: the answer
        depends on the grammar, not on the tokenizer alone)."""
        ct = self.ct
        tb = ct.info.token_bytes
        rest = forced[pos:]
        n = len(rest)
        if n == 1:      # every token starting with the rest's byte: the canonical ones, longer
            words = ct._first_bytes[1][rest[0]].copy()
            self.allowed_words(words)
            ids = _ids_of(words, words.shape[0])
            ids = ids[ct.token_len[ids] > 1]
        else:           # the tokens running past the rest (often none), then the canonical ones
            lo, hi = ct.prefix_range(rest)
            ids = ct._sorted_tokens[1][lo:hi]
            ids = ids[ct.token_len[ids] > n]
            if len(ids) == 0:
                return False
        nb = self._next_after
        if nb is not None and len(ids):     # their byte past the forced text: one the grammar allows
            data, off, _rank = ct.info.token_bytes_flat()
            byte = data[off[ids] + n].astype(np.int64)
            ids = ids[((nb[byte >> 5] >> (byte & 31).astype(np.uint32)) & 1).astype(bool)]
        if n > 1 and len(ids):
            if len(ids) <= 16:
                ids = ids[[self.allows(r) for r in ids.tolist()]]
            else:
                words = ct._first_bytes[1][rest[0]].copy()
                self.allowed_words(words)
                ids = ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)]
        if len(ids) == 0:
            return False
        self._asked = True
        if len(ids) <= 8:
            return any(self._grammar_takes(forced[:pos] + tb[r]) for r in ids.tolist())
        # many (tokens starting with '"'): the grammar's own mask after the prefix, once
        g = self._grammar_words_after(forced[:pos])
        return bool(((g[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).any())

    def _grammar_words_after(self, data: bytes) -> np.ndarray:
        """The grammar's plain mask after ``data`` from the state the lookahead started in
        (memoised per lookahead: the candidates of one mask share prefixes of their text)."""
        memo = self._after_masks
        hit = memo.get(data)
        if hit is None:
            hit = np.zeros(self.ct.n_words, np.uint32)
            self._matcher.plain_words_after(data, hit)
            memo[data] = hit
        return hit

    def _viable_after(self, matcher, t: int, depth: int, n_words: int, stops) -> bool:
        if not matcher.accept_token(t):
            return False
        try:
            if matcher.is_terminated():
                return True
            self._budget -= 1
            inner = np.zeros(n_words, np.uint32)
            matcher.fill_words(inner)
            # the ids only when few words are set (more words than the limit: more tokens too)
            cand = _ids_of(inner, self.lookahead_limit)
            if cand is None:
                return True
            if len(cand) == 0:
                return False
            if depth <= 1 or self._budget <= 0 or len(cand) > self.lookahead_limit:
                return True
            if any(int(c) in stops for c in cand):
                return True
            return any(self._viable_after(matcher, int(c), depth - 1, n_words, stops) for c in cand)
        finally:
            matcher.rollback(1)

    def restrict(self, words: np.ndarray, stop_ids) -> int:
        """AND the canonical condition into the grammar's mask ``words``; a stop token the grammar
        allows stays allowed iff the text may end here canonically. Returns the non-zero words
        left where that was counted on the way, else -1 (for :meth:`prune_dead_ends`)."""
        V = self.ct.vocab_size
        stops = None
        for t in stop_ids:
            if 0 <= t < V and (words.item(t >> 5) >> (t & 31)) & 1:
                stops = [t] if stops is None else stops + [t]
        nz = self.allowed_words(words)
        if stops and self.can_end():
            for t in stops:
                words[t >> 5] |= np.uint32(1 << (t & 31))
            nz = -1
        return nz

    def _settle(self) -> None:
        """Drop the region's prefix up to the last junction that is a boundary under every
        consistent probe future (and before which every such future agrees)."""
        if self.pending or len(self.tokens) < 2:
            return
        cut_i = self.ct.cut_index(self._region())
        if cut_i < 0:
            return
        k = self._jtok[cut_i]              # tokens[k:] stay
        self.tokens = self.tokens[k:]
        self.pair_ok = self.pair_ok[k:]
        self._key = None


