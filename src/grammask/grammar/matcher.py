"""GrammarMatcher: the per-request state machine that fills token bitmasks and accepts tokens.

The API mirrors xgrammar's ``GrammarMatcher`` so users can switch: ``fill_next_token_bitmask``,
``accept_token``, ``accept_string``, ``rollback``, ``is_terminated``, ``reset``, ``fork``,
``find_jump_forward_string``. One matcher per request; matchers never share mutable state except
the compiled grammar's lexer, which only grows (under a lock).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from ..errors import MatcherError
from .compiled import CompiledGrammar
from .earley import MISSING, OK, REJECT, STOP_AT_MISSING, stack_key
from .kstruct import kstruct
from .mask import (FastCall, WalkBuffers, advance_bytes, allowed_bytes, can_end, fill_mask, fill_mask_cached,
                   forced_after, jump_forward, walk_stack)
from .skip_rows import SkipPool, shared_skip_rows
from .utf8 import utf8_prefix

# the kernels that may build lexer states take an expander last: None (their read-only variant,
# compiled apart) or one from Lexer.inline_expander (the ``_x`` wrappers)
_fill_mask = FastCall(fill_mask)
_fill_mask_cached = FastCall(fill_mask_cached)
_advance_bytes = FastCall(advance_bytes)
_fill_mask_x = FastCall(fill_mask)
_fill_mask_cached_x = FastCall(fill_mask_cached)
_advance_bytes_x = FastCall(advance_bytes)
_can_end = FastCall(can_end)
_forced_after = FastCall(forced_after)
_forced_after_x = FastCall(forced_after)
_jump_forward = FastCall(jump_forward)
_jump_forward_x = FastCall(jump_forward)
_stack_key = FastCall(stack_key)
_NO_PROBE: dict = {}     # zero probe masks, by width
_NO_KNOWN: dict = {}     # no probe verdicts, by width
#: the order forced_after scans a lexer row in: the bytes a JSON or text state most often reads
_FIRST = [32, 9, 10, 13, 34, 44, 58, 46, 45, *range(48, 58), *range(97, 123), *range(65, 91)]
_SCAN_ORDER = np.array(_FIRST + [b for b in range(256) if b not in _FIRST], np.int64)
#: lexer states whose tokens without forced text forced_after_words keeps, per lexer
MAX_SKIP_STATES = 1024
#: a lexer generation's first mask goes straight to the building call (:meth:`fill_words`): its
#: walk meets states not built yet (the compile's warm-up builds only the initial state's
#: neighbourhood; the first masks of the 1-in-20 MaskBench sample's median schemas went on to the
#: building call), so the read-only call before it was ~28 us of the time to first mask for nothing
SKIP_FIRST_READ_ONLY = True
_FILL_ERROR = "internal error: the mask kernel did not settle"
#: :meth:`GrammarMatcher.state_key` is None past this many int32 (the reachable rows' items)
STATE_KEY_MAX_LEN = 1 << 16
_INT32 = np.dtype(np.int32)


_NO_SLOTS = np.zeros(0, np.int64)


class GrammarMatcher:
    """Match one token sequence against a compiled grammar.

    ``stop_token_ids`` defaults to the tokenizer's; stop tokens are allowed exactly when the
    grammar can end, and accepting one terminates the matcher. ``max_rollback_tokens`` bounds
    the history kept for :meth:`rollback` (-1: unbounded).
    """

    def __init__(self, compiled: CompiledGrammar, stop_token_ids=None, *,
                 terminate_without_stop_token: bool = False, max_rollback_tokens: int = -1,
                 canonical=False, canonical_fallback: bool = False):
        self.compiled = compiled
        info = compiled.tokenizer_info
        self.tokenizer_info = info
        self.vocab_size = info.vocab_size
        self.stop_token_ids = list(info.stop_token_ids if stop_token_ids is None else stop_token_ids)
        self._stop_set = frozenset(self.stop_token_ids)
        self.terminate_without_stop_token = terminate_without_stop_token
        self.max_rollback_tokens = max_rollback_tokens
        self._token_bytes = info.token_bytes
        self._M = compiled.missing_for_matcher()
        depth = int(compiled.forest.trie.max_depth) + 2
        self._walk = kstruct(WalkBuffers(
            ls_st=np.zeros(depth, np.int32), h_st=np.zeros(depth, np.int32),
            found=np.empty(compiled.forest.trie.n_tokens + 1, np.int32),  # written before read
            stop_ids=np.array([t for t in self.stop_token_ids if 0 <= t < self.vocab_size], np.int32),
            req=np.zeros(1 + 2 * 64, np.int64),
            stack=walk_stack(depth, compiled.forest.arrays.seg_start.shape[0])))
        self._out = np.zeros(2, np.int32)
        self._n_words = (self.vocab_size + 31) // 32
        self._F = compiled.forest.arrays   # (the tokenizer's: read on every mask)
        #: the state cache of ``_mc_lexer`` (the lexer generation the last mask read), kept here
        self._mc_lexer = None
        self._mc = None
        #: what one mask's walk can read: a prefix of a token (see Lexer.walk_state)
        self._reach = compiled.reach
        self._ok = np.zeros(256, np.uint8)
        self._special = np.zeros(0, np.int64)
        # canonical=True (or a CanonicalTokenizer): only canonical token sequences (canonical.py)
        self._canon = None
        if canonical:
            from .canonical import CanonicalState, CanonicalTokenizer, canonical_tokenizer

            ct = canonical if isinstance(canonical, CanonicalTokenizer) else canonical_tokenizer(info)
            self._canon = CanonicalState(ct)
        #: with ``canonical``: where the canonical mask is empty while the grammar still allows
        #: tokens (a dead end the lookahead did not see), give the grammar's plain mask for that
        #: step instead of an empty one; the token taken there is read as raw text (the next one is
        #: judged as after a pre-token boundary) and counted in :attr:`canonical_fallbacks`
        self.canonical_fallback = bool(canonical_fallback)
        #: steps that fell back to the plain mask (not undone by :meth:`rollback`)
        self.canonical_fallbacks = 0
        self._fallback_step = False
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        self._stack = self.compiled.new_stack()
        #: the lexer generation that ``_s`` and the history's states belong to (see _sync)
        self._lexer = self.compiled.current_lexer()
        self._s = self._lexer.initial_state
        self._h = 1
        self._lex_len = 0
        self._terminated = False
        maxlen = None if self.max_rollback_tokens < 0 else self.max_rollback_tokens
        self._history: deque = deque(maxlen=maxlen)
        self._fallback_step = False
        if self._canon is not None:
            self._canon.reset()

    def fork(self) -> "GrammarMatcher":
        new = object.__new__(GrammarMatcher)
        new.__dict__.update(self.__dict__)
        new._stack = self._stack.copy()
        new._M = self.compiled.new_missing(self.compiled.flat.n_lexemes)
        w = self._walk
        new._walk = kstruct(WalkBuffers(w.ls_st.copy(), w.h_st.copy(), w.found.copy(), w.stop_ids, w.req.copy(),
                                        np.empty_like(w.stack)))
        new._out = self._out.copy()
        new._ok = self._ok.copy()
        new.__dict__.pop("_fa_cand", None)     # forced_after_words' scratch: a fork may run in another thread
        new.__dict__.pop("_sk_buf", None)      # (and state_key's)
        new._history = deque(self._history, maxlen=self._history.maxlen)
        if self._canon is not None:
            new._canon = self._canon.copy()
        return new

    def is_terminated(self) -> bool:
        return self._terminated

    # ------------------------------------------------------------------ kernel driver
    def _sync(self) -> None:
        """Move this matcher's lexer states to the compiled grammar's newest lexer generation
        when there is a newer one or ours is full (see :mod:`.lexer`); called first by every
        public method that reads the lexer. The parse stack holds no lexer ids that are read
        again once the rows above the height are marked stale (``info[3]``, see
        :func:`~.earley.row_top`), so the current state and the rollback history are all there is
        to move."""
        lx = self._lexer
        if lx is self.compiled.lexer and not lx.full:
            return
        new = self.compiled.current_lexer()
        if new is lx:
            return
        seen: dict[int, int] = {}

        def move(s: int) -> int:
            t = seen.get(s)
            if t is None:
                t = seen[s] = new.translate(lx, s)
            return t

        self._s = move(self._s)
        self._history = deque([(move(s), h, n, t) for s, h, n, t in self._history], maxlen=self._history.maxlen)
        self._lexer = new
        # rows above the height hold start states of the old generation: none may be reused
        self._stack.arrays.info[3] = 0

    def state_key(self):
        """A hashable key of this matcher's state, whatever its history, or None: two matchers of
        this grammar (in one lexer generation) with equal keys give the same masks and accept the
        same tokens from here on. It is the parse's reachable rows (:func:`~.earley.stack_key`:
        the same place in each element of an array after the first has one key), the lexer state
        (its id is the generation's: a key is only compared with keys of that generation, as
        :class:`.canonical.LookaheadMemo` does) and whether anything was read at all (``can_end``
        asks only that of the position). None when the reachable rows hold more than
        :data:`STATE_KEY_MAX_LEN` numbers."""
        buf = self.__dict__.get("_sk_buf")
        if buf is None:
            buf = self._sk_buf = np.empty(1024, np.int32)
        while True:
            n = _stack_key(self._stack.arrays, self._h, buf)
            if n >= 0:
                return (buf[:n].tobytes(), self._s, self._lex_len > 0, self._terminated)
            if buf.shape[0] >= STATE_KEY_MAX_LEN:
                return None
            buf = self._sk_buf = np.empty(2 * buf.shape[0], np.int32)

    def _call(self, fn, *head, tail=()):
        """Run kernel ``fn(*head, G, L, P, M, *tail)`` until it settles (:meth:`CompiledGrammar.run`)."""
        return self.compiled.run(fn, self._stack, self._M, head, tail, lexer=self._lexer)

    def _call_building(self, fn, fx, head: tuple, tail: tuple):
        """Run a kernel that takes an expander last (``fn``/``fx``: its read-only and building
        wrappers) until it settles: read-only first (most calls meet only built states); where
        it met states not built, once more building them as it meets them (an eager lexer,
        :meth:`CompiledGrammar.call_building`: one call where the read-only variant needs a Python
        round per state met in a row, e.g. per byte of forced text); the driver's loop for what
        that left. (:meth:`_advance` and :meth:`fill_words` take the same steps inline: they run
        on every token.)"""
        comp, lexer, stack, M = self.compiled, self._lexer, self._stack, self._M
        r = fn(*head, comp.G, lexer.tables, stack.arrays, M, *tail, None)
        st = r[0] if isinstance(r, tuple) else r
        if st == OK or st == REJECT:
            return r
        if st == MISSING and lexer.eager:
            r = comp.call_building(fx, stack, M, head, tail, lexer)
            st = r[0] if isinstance(r, tuple) else r
            if st == OK or st == REJECT:
                return r
        comp.resolve(st, stack, M, lexer)
        return comp.run(fn, stack, M, head, (*tail, None), lexer=lexer)

    def _can_end_now(self) -> bool:
        _, e = self._call(_can_end, self._s, self._h, self._lex_len)
        return bool(e)

    def _advance(self, data: bytes) -> bool:
        arr = np.frombuffer(data, dtype=np.uint8)
        # the kernel called directly (a token's bytes rarely meet a state not built yet); the
        # driver's loop only when it asks for something
        lexer = self._lexer
        st = _advance_bytes(arr, self._s, self._h, self.compiled.G, lexer.tables, self._stack.arrays, self._M,
                            self._out, None)
        if st == MISSING and lexer.eager:
            # again, building what is missing as it goes (see fill_words)
            st = self.compiled.call_building(_advance_bytes_x, self._stack, self._M, (arr, self._s, self._h),
                                             (self._out,), lexer)
        if st != OK and st != REJECT:
            self.compiled.resolve(st, self._stack, self._M, lexer)
            st = self._call(_advance_bytes, arr, self._s, self._h, tail=(self._out, None))
        if st != OK:
            return False
        self._s, self._h = int(self._out[0]), int(self._out[1])
        self._lex_len += len(data)
        return True

    # ------------------------------------------------------------------ public API
    def accept_token(self, token_id: int, *, debug_print: bool = False) -> bool:
        """Advance by one token. Returns False (state untouched) when the grammar rejects it."""
        if self._terminated:
            return False
        lx = self._lexer
        if lx is not self.compiled.lexer or lx.full:   # _sync's test, inline on the hot path
            self._sync()
        token_id = int(token_id)
        canon = self._canon
        if canon is not None and self._fallback_step:
            return self._accept_fallback(token_id)
        if token_id in self._stop_set:
            if not self._can_end_now() or (canon is not None and not canon.can_end()):
                return False
            self._history.append((self._s, self._h, self._lex_len, self._terminated))
            if canon is not None:
                canon.push_marker()
            self._terminated = True
            return True
        if not 0 <= token_id < len(self._token_bytes):
            return False
        data = self._token_bytes[token_id]
        if not data:
            return False
        saved = (self._s, self._h, self._lex_len, self._terminated)
        if self._canon is not None and not self._canon.allows(token_id):
            return False
        if not self._advance(data):
            return False
        self._history.append(saved)
        if self._canon is not None:
            self._canon.push(token_id)
        if self.terminate_without_stop_token and self._can_end_now() and not self._has_continuation():
            self._terminated = True
        return True

    def _accept_fallback(self, token_id: int) -> bool:
        """:meth:`accept_token` at a step whose mask fell back to the plain one: the grammar alone
        decides; the canonical state starts afresh after the token (as after raw text)."""
        canon = self._canon
        self._canon = None
        try:
            ok = self.accept_token(token_id)
        finally:
            self._canon = canon
        if ok:
            canon.push_text()
            self._fallback_step = False
            self.canonical_fallbacks += 1
        return ok

    def accept_string(self, data: str | bytes, *, debug_print: bool = False) -> bool:
        """Advance by raw text (counts as one step for :meth:`rollback`)."""
        if self._terminated:
            return False
        if isinstance(data, str):
            data = data.encode("utf-8")
        self._sync()
        saved = (self._s, self._h, self._lex_len, self._terminated)
        if data and not self._advance(data):
            return False
        self._history.append(saved)
        if self._canon is not None:
            self._canon.push_text()
        return True

    def accepts_bytes(self, data: bytes) -> bool:
        """Whether the grammar accepts ``data`` from here; the state is left as it is (the parse
        rows the call built above the height are scratch, as after a rejected token)."""
        if self._terminated:
            return False
        self._sync()
        if not data:
            return True
        saved = (self._s, self._h, self._lex_len)
        ok = self._advance(data)
        self._s, self._h, self._lex_len = saved
        return ok

    def plain_words_after(self, data: bytes, words: np.ndarray) -> bool:
        """The grammar's own mask (no canonical condition) after ``data`` from here, into
        ``words``; False (``words`` untouched) where the grammar rejects ``data``. The state is
        left as it is: the dead-end lookahead asks this in the middle of a canonical mask, where a
        fork (its parse stack and walk buffers copied) cost ~200 us."""
        if self._terminated:
            return False
        self._sync()
        lx = self._lexer
        saved = (self._s, self._h, self._lex_len, self._terminated)
        canon, self._canon = self._canon, None
        try:
            if data and not self._advance(data):
                return False
            self.fill_words(words)
            return True
        finally:
            self._canon = canon
            s = saved[0]
            if self._lexer is not lx:   # (the mask moved the matcher to a new lexer generation)
                s = self._lexer.translate(lx, s)
            self._s, self._h, self._lex_len, self._terminated = s, saved[1], saved[2], saved[3]

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        if num_tokens < 0 or num_tokens > len(self._history):
            raise MatcherError(f"cannot roll back {num_tokens} tokens: {len(self._history)} in history")
        for _ in range(num_tokens):
            self._s, self._h, self._lex_len, self._terminated = self._history.pop()
            if self._canon is not None:
                self._canon.pop()
        if num_tokens:
            self._fallback_step = False

    def _has_continuation(self) -> bool:
        self._call(allowed_bytes, self._s, self._h, tail=(self._ok,))
        return bool(self._ok.any())

    def fill_next_token_bitmask(self, bitmask, index: int = 0, *, debug_print: bool = False) -> bool:
        """Write the allowed tokens into row ``index`` of ``bitmask`` (int32 ``[batch, ceil(V/32)]``,
        numpy or a CPU torch tensor). Returns True (the mask must be applied)."""
        row = _row_words(bitmask, index)
        self.fill_words(row)
        return True

    def fill_words(self, words: np.ndarray) -> None:
        """Fill one mask row given as a uint32 numpy array of ``ceil(V/32)`` words."""
        n_words = self._n_words
        if words.shape[0] < n_words:
            raise MatcherError(f"bitmask row has {words.shape[0]} words, vocabulary needs {n_words}")
        if self._terminated:
            words[:] = 0
            self._set_stop(words)
            return
        comp = self.compiled
        lexer = self._lexer
        if lexer is not comp.lexer or lexer.full:   # _sync's test, inline on the hot path
            self._sync()
            lexer = self._lexer
        # the walk reads one token: from a state that reads every token as ours does (far
        # counters capped, so the positions of a long string share it)
        s = lexer._twins.get(self._s)   # walk_state's memo, read inline on the hot path
        if s is None:
            s = lexer.walk_state(self._s, self._reach)
        if self._mc_lexer is lexer:
            mc = self._mc
        else:
            mc = self._mc = comp.mask_cache_of(lexer)
            self._mc_lexer = lexer
        skip, combo, _visits, cache, acc = mc.entry(s)
        w = self._walk
        if words.shape[0] != n_words:
            words = words[:n_words]
        F = self._F
        if cache is not None:
            fn, fx, head = _fill_mask_cached, _fill_mask_cached_x, (F, combo, cache, acc, s, self._h, self._lex_len)
        else:
            fn, fx, head = _fill_mask, _fill_mask_x, (F, skip, s, self._h, self._lex_len)
        stack, M, tail = self._stack, self._M, (w, mc.store, words, None)
        # the kernel called directly, building nothing (most masks read only built states: no
        # lock); where it met states not built yet, once more holding the lexer's lock, building
        # them as it meets them (:func:`.lexer.inline_resolve`); the driver's loop (build what it
        # asked for, call again) only for what that left
        if lexer.eager:
            # the read-only call stops at the first state not built (the building call walks
            # the whole trie again; what the read-only one recorded past that would be dropped)
            if lexer._expander is not None or not SKIP_FIRST_READ_ONLY:   # (Lexer.walked, inline)
                cnt = M.counts
                cnt[STOP_AT_MISSING] = 1
                st = fn(*head, comp.G, lexer.tables, stack.arrays, M, *tail)
                cnt[STOP_AT_MISSING] = 0
            else:   # the generation's first walk: see SKIP_FIRST_READ_ONLY
                st = MISSING
            if st == MISSING:
                st = comp.call_building(fx, stack, M, head, (w, mc.store, words), lexer)
        else:
            st = fn(*head, comp.G, lexer.tables, stack.arrays, M, *tail)
        if st != OK and st != REJECT:
            comp.resolve(st, stack, M, lexer)
            comp.run(fn, stack, M, head, tail, _FILL_ERROR, lexer)
        if w.req[0]:
            mc.requested(w.req)
        if self._canon is not None:
            # (``words`` is ``n_words`` long here)
            self._fallback_step = False     # (the lookahead below accepts tokens on this matcher)
            plain = words.copy() if self.canonical_fallback else None
            nz = self._canon.restrict(words, self.stop_token_ids)
            self._canon.prune_dead_ends(self, words, nz)
            self._fallback_step = plain is not None and not words.any() and bool(plain.any())
            if self._fallback_step:
                words[:] = plain

    def _set_stop(self, words: np.ndarray) -> None:
        for t in self.stop_token_ids:
            if 0 <= t < self.vocab_size:
                words[t >> 5] |= np.uint32(1 << (t & 31))

    def get_next_token_bitmask(self) -> np.ndarray:
        words = np.zeros((self.vocab_size + 31) // 32, np.uint32)
        self.fill_words(words)
        return words.view(np.int32)

    def find_jump_forward_bytes(self, max_bytes: int = 4096) -> bytes:
        """Bytes the grammar forces from here (possibly ending inside a UTF-8 character)."""
        if self._terminated:
            return b""
        self._sync()
        buf = np.zeros(max_bytes, np.uint8)
        st, n = self._call_building(_jump_forward, _jump_forward_x, (self._s, self._h, self._lex_len), (buf, self._ok))
        return bytes(buf[:n])

    def forced_after_words(self, words: np.ndarray, max_bytes: int = 32, cached: bool = True,
                           probe: np.ndarray | None = None, known=None):
        """The tokens of ``words`` (allowed now) after which the grammar forces text: returns
        ``(hit, flen, fbuf, nxt)``, token ``hit[j]`` being followed by ``fbuf[j, :flen[j]]`` (at most
        ``max_bytes``; -1: the grammar rejects it) and then by one of the bytes whose bits
        ``nxt[j]`` (8 words) sets. One compiled call (:func:`.mask.forced_after`); the state is
        unchanged. A token read by lexer moves alone, after which the lexer alone reads two
        bytes, has no forced text from any parser state over the same lexer state: with
        ``cached``, such tokens are kept per lexer state (:meth:`_forced_skip`) and not read
        again there. ``probe`` (bits over the vocabulary): tokens reported even with nothing
        forced after them, ``flen`` 0 (or -2 where the grammar may end after them) and ``nxt`` the
        bytes that may follow them. ``known``: ``(index of each token among the probes (-1: not
        one), first bytes [n, 8], may end [n], known [n], the same after every region [n])``, the
        verdicts the kernel gives itself (see :func:`.mask.forced_after`): a probe known to be
        viable is not reported, one known not to be is, with ``flen`` -3; with ``cached``, the
        probes of the last kind that the lexer alone finds viable are kept per lexer state
        (:meth:`narrow_live`)."""
        self._sync()
        nw = words.shape[0]
        if cached:
            pool = self._skip_pool(nw)
            pool.slot(self._s, self._lexer)
            bits, slot_of = pool.bits, pool.slot_of
        else:
            bits, slot_of = np.zeros((1, nw), np.uint32), _NO_SLOTS
        if probe is None:
            probe = _NO_PROBE.get(nw)
            if probe is None:
                probe = _NO_PROBE[nw] = np.zeros(nw, np.uint32)
        if known is None:     # every probe unknown (the kernel reads the index of each)
            known = _NO_KNOWN.get(nw)
            if known is None:
                known = _NO_KNOWN[nw] = (np.full(nw * 32, -1, np.int64), np.zeros((1, 8), np.uint32),
                                         np.zeros(1, bool), np.zeros(1, bool), np.zeros(1, bool))
            live = probe        # (no probe is known: nothing is written)
        else:
            live = self.narrow_live(nw) if cached else np.zeros(nw, np.uint32)
        info = self.compiled.tokenizer_info
        data, off, rank = info.token_bytes_flat()
        by_rank = info.token_by_rank()
        cand = self.__dict__.get("_fa_cand")
        if cand is None or cand.shape[0] < nw * 32:
            cand = self._fa_cand = np.empty(nw * 32, np.int64)     # scratch, one entry per token
        cap = 256
        while True:
            out_n = np.zeros(4, np.int64)
            hit = np.empty(cap, np.int64)
            flen = np.zeros(cap, np.int64)
            fbuf = np.zeros((cap, max_bytes), np.uint8)
            nxt = np.zeros((cap, 8), np.uint32)
            self._call_building(_forced_after, _forced_after_x, (self._s, self._h, self._lex_len),
                                (words, bits, slot_of, probe, *known, live, rank, by_rank, data, off, _SCAN_ORDER, self._ok, cand,
                                 out_n, hit, flen, fbuf, nxt))
            if cached and out_n[2] >= 0:
                pool.slot(int(out_n[2]), self._lexer)     # (kept from the next call on)
            self._fa_read = int(out_n[3])     # (how many candidates the last call read)
            if not out_n[1]:
                k = int(out_n[0])
                return hit[:k], flen[:k], fbuf[:k], nxt[:k]
            cap *= 4

    def narrow_live(self, n_words: int | None = None) -> np.ndarray:
        """The probes :meth:`forced_after_words` found viable from the current lexer state by lexer
        moves alone, with the follower rows they have after every region (bits over the
        vocabulary; see :func:`.mask.forced_after`), kept on the lexer as :meth:`_forced_skip`."""
        return self._per_lexer_state("_narrow_live", n_words)

    def _forced_skip(self, n_words: int | None = None) -> np.ndarray:
        """The tokens :meth:`forced_after_words` knows to have no forced text from the current
        lexer state (bits over the vocabulary: a view of its row in :meth:`_skip_pool`, or zeros
        where it has none)."""
        pool = self._skip_pool(n_words or (self.vocab_size + 31) // 32)
        k = pool.slot(self._s, self._lexer)
        return pool.bits[k] if k >= 0 else np.zeros(pool.n_words, np.uint32)

    def _skip_pool(self, n_words: int) -> SkipPool:
        """The lexer's :class:`.skip_rows.SkipPool` (made at the first use)."""
        self._sync()
        lexer = self._lexer
        pool = lexer.__dict__.get("_skip_pool")
        if pool is None or pool.n_words != n_words:
            shared = shared_skip_rows(lexer.exprs, self.compiled.tokenizer_info, n_words)
            pool = lexer.__dict__["_skip_pool"] = SkipPool(shared)
        return pool

    def _per_lexer_state(self, name: str, n_words: int | None) -> np.ndarray:
        """The bits over the vocabulary kept on the lexer under ``name`` for the current lexer
        state (zeros when new; at most :data:`MAX_SKIP_STATES` states, then cleared)."""
        self._sync()
        lexer = self._lexer
        store = lexer.__dict__.get(name)
        if store is None:
            store = lexer.__dict__.setdefault(name, {})
        bits = store.get(self._s)
        if bits is None:
            if len(store) >= MAX_SKIP_STATES:
                store.clear()
            bits = store[self._s] = np.zeros(n_words or (self.vocab_size + 31) // 32, np.uint32)
        return bits

    def find_jump_forward_string(self) -> str:
        """The forced text from here, cut to whole UTF-8 characters (xgrammar's API)."""
        data = self.find_jump_forward_bytes()
        return utf8_prefix(data).decode("utf-8")

    def can_terminate(self) -> bool:
        """True when a stop token would be accepted now."""
        if self._terminated:
            return False
        self._sync()
        return self._can_end_now()

    @property
    def num_accepted(self) -> int:
        return len(self._history)



def _row_words(bitmask, index: int) -> np.ndarray:
    """A writable uint32 numpy view of row ``index`` of an int32 bitmask (numpy or CPU torch)."""
    if type(bitmask) is np.ndarray and bitmask.dtype == _INT32 and bitmask.ndim == 2 and bitmask.flags.c_contiguous:
        return bitmask[index].view(np.uint32)   # the usual case, checked at once
    if isinstance(bitmask, np.ndarray):
        arr = bitmask
    else:  # torch tensor on CPU: share memory through numpy
        if getattr(bitmask, "device", None) is not None and bitmask.device.type != "cpu":
            raise MatcherError("fill_next_token_bitmask needs a CPU bitmask; copy it to the device after filling")
        arr = bitmask.numpy()
    if arr.dtype != np.int32:
        raise MatcherError(f"bitmask must be int32, got {arr.dtype}")
    if arr.ndim == 1:
        if index != 0:
            raise MatcherError("index must be 0 for a 1-D bitmask")
        row = arr
    else:
        row = arr[index]
    if not row.flags["C_CONTIGUOUS"]:
        raise MatcherError("bitmask rows must be contiguous")
    return row.view(np.uint32)
