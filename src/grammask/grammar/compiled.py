"""A compiled grammar: Earley tables + lazy lexer, bound to one tokenizer."""
from __future__ import annotations

import threading
import time

import numpy as np

from ..errors import GrammarError
from .cfg import FlatGrammar, Grammar, lower
from .earley import (GROW_HASH, GROW_ITEMS, GROW_ROWS, MISSING, OK, REJECT, MissingRequests, ParseStack,
                     grammar_tables, initial_row, new_missing)
from .lexer import MAX_LEXER_STATES, Lexer
from .mask import FastCall, chain_expand, chain_frontier
from .slicer import forest_sub_depth

#: calls of one kernel (with Python's work between them) before :meth:`CompiledGrammar.run` gives up
MAX_RESOLVE_ROUNDS = 100_000
_initial_row = FastCall(initial_row)
_chain_expand = FastCall(chain_expand)
#: rounds of :func:`.mask.chain_expand` per call (Python checks the lexer between calls)
CHAIN_ROUNDS = 256


def _clear_requests(M: MissingRequests) -> None:
    """Empty request buffers ``M`` (their counts, and the first start set's offset)."""
    M.counts[:] = 0
    M.start_off[0] = 0


class CompiledGrammar:
    """What :class:`~.matcher.GrammarMatcher` runs: immutable tables plus a lexer DFA that grows
    lazily (shared, thread-safe) as matchers meet new lexer states. ``lexer`` is the newest
    generation of that DFA: past ``max_lexer_states`` states a fresh one replaces it (see
    :mod:`.lexer`), so the memory a grammar holds stays bounded however long it is used."""

    def __init__(self, grammar: Grammar, tokenizer_info, *, root: str | int = "root",
                 check_lexemes: bool = True, kind: str = "grammar", source: str = "",
                 max_lexer_states: int = MAX_LEXER_STATES):
        t0 = time.perf_counter()
        self.tokenizer_info = tokenizer_info
        self.kind = kind
        self._source = source
        self.exprs = grammar.exprs
        self.flat: FlatGrammar = lower(grammar, root, check_lexemes=check_lexemes)
        f = self.flat
        self.G = grammar_tables(f)
        self.lexer = Lexer(self.exprs, f.lexemes, max_lexer_states)
        self._swap_lock = threading.Lock()
        #: how many times the lexer was replaced by a successor generation
        self.lexer_generations = 0
        # the initial row is the same for every matcher: build it once and warm the lexer up
        stack = ParseStack(f)
        M = self.new_missing(f.n_lexemes)
        self.run(_initial_row, stack, M, (), (), "internal error: initial parser row did not settle")
        _clear_requests(M)
        #: the request buffers of the initial row, handed to the first matcher (:meth:`missing_for_matcher`)
        self._spare_missing = M
        self._template = stack   # every matcher starts from a copy (never written to)
        self.initial_state = int(stack.arrays.row_ls[0])
        self.lexer.initial_state = self.initial_state
        self.lexer.warm_up(self.initial_state, budget=64)
        self._forest = None
        #: the compile's memory estimate (set by the compiler that bounds it)
        self.compile_bytes = 0
        self._retired_bytes = 0
        self.compile_time_s = time.perf_counter() - t0

    @property
    def source(self) -> str:
        """The grammar's source text (EBNF, regex, or the schema's canonical JSON text)."""
        if callable(self._source):
            self._source = self._source()
        return self._source

    @property
    def forest(self):
        """The tokenizer's slice forest (built once per tokenizer, shared)."""
        if self._forest is None:
            from .slicer import slice_forest

            self._forest = slice_forest(self.tokenizer_info)
        return self._forest

    @property
    def reach(self):
        """What one mask's walk can read of a counter (:class:`.TokenReach`, per tokenizer)."""
        from .reach import token_reach

        return token_reach(self.tokenizer_info)

    @property
    def slicer(self):
        """The slice checker of the current lexer generation."""
        return self.slicer_of(self.lexer)

    def slicer_of(self, lexer: Lexer):
        """The slice checker of ``lexer`` (one per generation: its proofs are per state)."""
        sl = lexer.__dict__.get("slicer")
        if sl is None:
            from .slicer import SliceChecker

            with self._swap_lock:
                sl = lexer.__dict__.get("slicer")
                if sl is None:
                    sl = lexer.slicer = SliceChecker(lexer, self.forest.patterns)
        return sl

    def mask_cache_of(self, lexer: Lexer):
        """The state cache of ``lexer`` (one per generation, as its states;
        :mod:`.state_cache`)."""
        mc = lexer.__dict__.get("mask_cache")
        if mc is None:
            from .state_cache import StateMaskCache

            slicer = self.slicer_of(lexer)
            with self._swap_lock:
                mc = lexer.__dict__.get("mask_cache")
                if mc is None:
                    mc = lexer.mask_cache = StateMaskCache(lexer, slicer, self.forest)
        return mc

    def current_lexer(self) -> Lexer:
        """The newest lexer generation, first replacing a full one by its successor."""
        lx = self.lexer
        if lx.full:
            with self._swap_lock:
                lx = self.lexer
                if lx.full:
                    if lx.exprs is self.exprs:
                        # what the first generation added to the grammar's own ExprSet stays
                        # there as long as the grammar does
                        self._retired_bytes += lx.grown_exprs_bytes()
                    lx = self.lexer = lx.successor()
                    self.lexer_generations += 1
        return lx

    # ------------------------------------------------------------------ kernel driver
    new_missing = staticmethod(new_missing)

    def run(self, kernel, stack: ParseStack, missing: MissingRequests, head: tuple, tail: tuple,
            error: str = "internal error: a mask kernel did not settle", lexer: Lexer | None = None):
        """Call ``kernel(*head, G, L, P, M, *tail)`` until it settles; return what it returned.

        ``G`` are this grammar's tables, ``L`` the current :class:`~.lexer.LexerTables` of
        ``lexer`` (the generation the caller's lexer states belong to; default the newest),
        ``P`` the arrays of ``stack`` and ``M`` the request buffers ``missing`` (one per matcher).
        The kernel returns a status, alone or first in a tuple:

        ``OK``, ``REJECT``
            settled: the result is returned as it is.
        ``MISSING``
            the kernel met lexer states that are not expanded (``trans`` says ``UNKNOWN``) or
            allowed-lexeme sets with no start state yet, treated them as dead, and recorded
            them: the states in ``M.states``, the sets' sorted lexemes in ``M.start_lex`` cut by
            ``M.start_off`` (``M.counts`` holds how many of each; a full buffer drops the
            request, the next round records it again). Python expands the states and registers
            the sets (:meth:`resolve`), clears the buffers and calls again with the new
            ``L``. The kernel also answers ``MISSING`` when it meets a state or lexeme set newer
            than the ``L`` it was given (another matcher's thread grew the lexer meanwhile):
            then there is nothing left to build, and calling again with the current ``L`` is
            the progress. So a round need not build anything; every round either builds or
            sees newer tables, and the lexer is finite.
        ``GROW_ITEMS``, ``GROW_ROWS``, ``GROW_HASH``
            a parse-stack array is full: :meth:`~.earley.ParseStack.grow` reallocates it (which
            rebuilds ``P``) and the kernel is called again (kernels only ever write the stack
            above the rows they were given, so a repeated call computes the same thing).

        Past :data:`MAX_RESOLVE_ROUNDS` rounds without settling, :class:`GrammarError` with
        ``error`` (an internal error: the lexer's state bound raises long before).
        """
        G = self.G
        if lexer is None:
            lexer = self.lexer
        for _ in range(MAX_RESOLVE_ROUNDS):
            r = kernel(*head, G, lexer.tables, stack.arrays, missing, *tail)
            st = r[0] if isinstance(r, tuple) else r
            if st == OK or st == REJECT:
                return r
            self.resolve(st, stack, missing, lexer)
        raise GrammarError(error)

    def call_building(self, kernel, stack: ParseStack, missing: MissingRequests, head: tuple, tail: tuple,
                      lexer: Lexer):
        """Call the building variant of a kernel, ``kernel(*head, G, L, P, M, *tail, XE)``, once:
        holding ``lexer``'s lock, with an expander (:meth:`.Lexer.inline_expander`), so that it
        builds the lexer states it meets as it meets them (:func:`.lexer.inline_resolve`); what
        the read-only call before it recorded is dropped (this call meets it again). Returns what
        the kernel returned; what it left to Python is in ``missing``, for :meth:`resolve`. An eager
        lexer only (docs/mask.md, section 4b)."""
        with lexer.lock, lexer.counting():
            XE = lexer.inline_expander()
            missing.counts[:] = 0
            r = kernel(*head, self.G, lexer.tables, stack.arrays, missing, *tail, XE)
            lexer.after_inline(XE)
        return r

    def resolve(self, status: int, stack: ParseStack, M: MissingRequests, lexer: Lexer | None = None) -> None:
        """Act on a kernel's request: build missing lexer states/start sets (in ``lexer``,
        default the newest generation), or grow arrays."""
        if status == MISSING:
            cnt = M.counts
            lx = self.lexer if lexer is None else lexer
            todo = set(M.states[: cnt[0]].tolist()) if cnt[0] else set()
            if cnt[1]:
                # one start state per distinct set (a walk meets the same set at many nodes), and
                # expanded in this round: the walk reads a byte from it next, so leaving it for
                # the next round would cost a whole trie walk for nothing
                if lx.eager:
                    todo.update(lx.start_states(M).tolist())   # all the sets in one compiled call
                else:
                    off = M.start_off.tolist()
                    lex = M.start_lex[: off[cnt[1]]].tolist()
                    for k in {tuple(lex[off[i]:off[i + 1]]) for i in range(cnt[1])}:
                        todo.add(lx.start_state(k))
            if todo:
                lx.expand_many(sorted(todo), lx.resolve_budget)
            if cnt[3]:
                self._expand_chains(lx, M)
            _clear_requests(M)
        elif status in (GROW_ITEMS, GROW_ROWS, GROW_HASH):
            stack.grow(status)
        else:  # pragma: no cover - kernels return nothing else
            raise GrammarError(f"internal error: unexpected kernel status {status}")

    def _expand_chains(self, lx: Lexer, M: MissingRequests) -> None:
        """Expand the lexer states a trie walk will meet in the small subtrees it skipped
        (``M.chains``: ``[node, state]`` pairs): plain lexer moves only, following the forest's
        trie bytes (a lexeme's end is left to the kernel's next round). A compiled walk of those
        subtrees (:func:`~.mask.chain_frontier`) names the states still to build; repeated until
        none is left. Without this a run of one byte (Llama-3 has tokens of 16+ spaces or
        dashes) costs a whole trie walk per byte."""
        forest = self.forest
        F = forest.arrays
        at = np.zeros(int(forest.trie.max_depth) + 2, np.int32)
        out = np.zeros(256, np.int32)
        deep = np.zeros(1, np.int64)
        sub_depth = forest_sub_depth(forest)
        pairs, n_pairs = M.chains, int(M.counts[3])
        if lx.eager:
            # the rounds in one compiled call (Python only where the expansion needs it)
            lx.expand_chains(_chain_expand, (F, pairs, n_pairs, at, out, sub_depth, deep), out, deep, CHAIN_ROUNDS)
            return
        for _ in range(10_000):
            n = chain_frontier(F, lx.tables.trans, pairs, n_pairs, at, out, sub_depth, deep)
            if not n:
                return
            # the rows of a run of bytes (whitespace, a key) as deep as the trie goes below
            # these states, in one round; the compiled expansion then walks down the run
            lx.expand_many(sorted(set(out[:n].tolist())), lx.resolve_budget,
                           ladder=int(deep[0]))

    def missing_for_matcher(self) -> MissingRequests:
        """Request buffers for a new matcher: the compile's own for the first one (a record less
        to make on the way to the first mask), then fresh ones."""
        M = self.__dict__.pop("_spare_missing", None)   # (one pop: two threads never share it)
        return self.new_missing(self.flat.n_lexemes) if M is None else M

    def new_stack(self) -> ParseStack:
        return self._template.copy()

    @property
    def memory_size_bytes(self) -> int:
        lx = self.lexer
        return int(sum(a.nbytes for a in self.G) + lx.trans_bytes() + lx.state_acc.nbytes
                   + lx.st_keys.nbytes + lx.st_vals.nbytes)

    def held_bytes(self) -> int:
        """An estimate of the memory this grammar holds now: its Earley tables and template
        stack, what its compile held (the :mod:`.membound` estimate, when compiled by a
        :class:`~.compiler.GrammarCompiler`) and its current lexer generation
        (:meth:`.Lexer.held_bytes`: it grows with use), with what its first generation left in the
        grammar's ExprSet. The grammar cache evicts by it."""
        return int(sum(a.nbytes for a in self.G) + self._template.nbytes + self.compile_bytes
                   + self._retired_bytes + self.lexer.held_bytes())

    def __repr__(self) -> str:
        return (f"CompiledGrammar(kind={self.kind!r}, lexemes={self.flat.n_lexemes}, "
                f"rules={len(self.flat.nt_prod_lo)}, lexer_states={self.lexer.n_states})")
