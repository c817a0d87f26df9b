"""A compiled grammar: Earley tables + lazy lexer, bound to one tokenizer."""
from __future__ import annotations

import time

import numpy as np

from ..errors import GrammarError
from .cfg import FlatGrammar, Grammar, lower
from .earley import GROW_HASH, GROW_ITEMS, GROW_ROWS, MISSING, OK, ParseStack, compute_row
from .lexer import Lexer

MAX_RESOLVE_ROUNDS = 100_000


class CompiledGrammar:
    """What :class:`~.matcher.GrammarMatcher` runs: immutable tables plus a lexer DFA that grows
    lazily (shared, thread-safe) as matchers meet new lexer states."""

    def __init__(self, grammar: Grammar, tokenizer_info, *, root: str | int = "root",
                 check_lexemes: bool = True, kind: str = "grammar", source: str = ""):
        t0 = time.perf_counter()
        self.tokenizer_info = tokenizer_info
        self.kind = kind
        self._source = source
        self.exprs = grammar.exprs
        self.flat: FlatGrammar = lower(grammar, root, check_lexemes=check_lexemes)
        f = self.flat
        self.G = (f.sym, f.end_lhs, f.prod_start, f.nt_prod_lo, f.nt_prod_hi,
                  f.nt_nullable.astype(np.int32))
        self.lexer = Lexer(self.exprs, f.lexemes)
        # the initial row is the same for every matcher: build it once and warm the lexer up
        stack = ParseStack(f)
        self._initial_row(stack)
        self._template = stack   # every matcher starts from a copy (never written to)
        self.initial_state = int(stack.row_ls[0])
        self.lexer.warm_up(self.initial_state, budget=64)
        self._forest = None
        self._slicer = None
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
    def slicer(self):
        if self._slicer is None:
            from .slicer import SliceChecker

            self._slicer = SliceChecker(self.lexer, self.forest.patterns)
        return self._slicer

    # ------------------------------------------------------------------ kernel plumbing
    def lexer_arrays(self):
        lx = self.lexer
        return (lx.trans, lx.state_acc, lx.acc_off, lx.acc_lex, lx.st_vals), lx.st_keys

    @staticmethod
    def new_missing(n_lex: int):
        return (np.zeros(4096, np.int32), np.zeros(max(16, 4 * n_lex), np.int32),
                np.zeros(65, np.int32), np.zeros(3, np.int32))

    def resolve(self, status: int, stack: ParseStack, M) -> None:
        """Act on a kernel's request: build missing lexer states/start sets, or grow arrays."""
        if status == MISSING:
            cnt = M[3]
            lx = self.lexer
            progressed = False
            for s in set(M[0][: cnt[0]].tolist()):
                if not lx.expanded[s]:
                    lx.expand(s, budget=0)
                    progressed = True
            off = M[2]
            for i in range(cnt[1]):
                allowed = M[1][off[i]:off[i + 1]].tolist()
                before = lx._n_start
                lx.start_state(allowed)
                progressed = progressed or lx._n_start != before
            cnt[:] = 0
            off[0] = 0
            if not progressed:
                # another thread may have built them meanwhile: that is progress too
                return
        elif status in (GROW_ITEMS, GROW_ROWS, GROW_HASH):
            stack.grow(status)
        else:  # pragma: no cover - kernels return nothing else
            raise GrammarError(f"internal error: unexpected kernel status {status}")

    def _initial_row(self, stack: ParseStack) -> None:
        M = self.new_missing(self.flat.n_lexemes)
        for _ in range(MAX_RESOLVE_ROUNDS):
            L, st_keys = self.lexer_arrays()
            st = compute_row(0, -1, self.G, L[2], L[3], st_keys, L[4], stack.P, stack.scratch, stack.hkeys, M)
            if st == OK and stack.row_ls[0] >= 0:
                return
            if st == OK:
                self.resolve(MISSING, stack, M)
            else:
                self.resolve(st, stack, M)
        raise GrammarError("internal error: initial parser row did not settle")

    def new_stack(self) -> ParseStack:
        return self._template.copy()

    @property
    def memory_size_bytes(self) -> int:
        f = self.flat
        lx = self.lexer
        return int(sum(a.nbytes for a in self.G) + lx.trans.nbytes + lx.state_acc.nbytes
                   + lx.st_keys.nbytes + lx.st_vals.nbytes)

    def __repr__(self) -> str:
        return (f"CompiledGrammar(kind={self.kind!r}, lexemes={self.flat.n_lexemes}, "
                f"rules={len(self.flat.nt_prod_lo)}, lexer_states={self.lexer.n_states})")
