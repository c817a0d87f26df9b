"""The compile memory bound: an estimate of what one compile holds, charged as it grows.

Front ends bound the counts of single constructs (repetition bounds, unrolled ``minItems``, union
sizes, ...) and lowering bounds its time; nothing of that bounds what a compile *holds*, which
grows with products of them (fifty rules of ``x{0,10000}``, sixty properties of
``minItems: 9000``, an enum of 200,000 strings). While :class:`~.compiler.GrammarCompiler`
compiles, a :class:`CompileMemory` is active in the compiling thread (:func:`compile_memory_bound`,
a context variable) and the places that allocate in proportion to the input charge it as they
grow, before the next step allocates more:

=====================  =============================================  ===========================
part                   charged by                                     estimate
=====================  =============================================  ===========================
``regex nodes``        ``ExprSet._sync``: the nodes the compiled      :data:`NODE_BYTES` each
                       store (``nodestore``) made since the last
                       call (counted, charged every
                       :data:`NODE_BATCH`)
``regex derivatives``  ``ExprSet._sync``: the derivatives the store   :data:`DERIV_BYTES` each
                       memoised since (counted, charged every
                       :data:`DERIV_BATCH`)
``grammar rules``      ``Grammar.nonterminal``/``define``/            :data:`RULE_BYTES` per rule,
                       ``add_alternative``                            :data:`ALT_BYTES` per
                                                                      alternative,
                                                                      :data:`SYMBOL_BYTES` per
                                                                      symbol
``lowered rules``      ``cfg.lower``: its working copy of the rules   the same
                       and the rules its lexeme splits add
``Earley tables``      ``cfg._flatten(_compiled)``: the int32 tables  their bytes
``lexer tables``       ``GrammarCompiler``, once the compile is done  their bytes
=====================  =============================================  ===========================

Going past the bound raises :class:`~grammask.errors.GrammarMemoryError` naming the part whose
growth crossed it, the estimate and the bound, and each part's share. A compile of shared state
(the compiler's :class:`~.regexset.ExprSet`) is charged for what it adds, not for what earlier
compiles left there. Compiles nest (the engine's ``get_or_compile`` around a front end): a charge
counts against every active bound, innermost first.

The per-item figures were measured with ``tracemalloc`` on CPython 3.11 (64-bit) and include the
indexes and per-node memos that go with an item; ``benchmarks/memory.py`` sets the estimate of
every MaskBench grammar beside its measured RSS growth.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from ..errors import GrammarMemoryError

#: the default of ``GrammarCompiler(max_compile_memory_bytes=...)``
DEFAULT_MAX_COMPILE_MEMORY_BYTES = 256 << 20

#: one ExprSet node: kind, args tuple, the hash-cons index entry (a packed int key), flags and
#: the memoised first-byte masks (and a byte of walk-state verdicts per reach, :meth:`.Lexer.walk_state`)
NODE_BYTES = 240
#: one memoised derivative (an int key ``e << 8 | byte`` and its dict slot)
DERIV_BYTES = 72
#: regex nodes and derivatives, and the grammar's rules, the hot paths, are counted as they are
#: made and charged in batches: of this many nodes, derivatives, bytes of rules (about 256 KiB each)
NODE_BATCH = 1024
DERIV_BATCH = 4096
RULES_BATCH = 256 << 10
#: one nonterminal: its name, index entry and the slots of the rule lists
RULE_BYTES = 168
#: one alternative (a list object and its slot)
ALT_BYTES = 64
#: one symbol of an alternative (its slot and a share of the int objects)
SYMBOL_BYTES = 16
#: one lexer state's Python side: its tuple, the index entry and the state's slice flags
STATE_BYTES = 400
#: one member ``(lexeme, expression)`` of a lexer state's tuple
MEMBER_BYTES = 80
#: one entry of an ExprSet's lexer-moves cache (a byte-class row and its target tuples)
MOVES_BYTES = 1400
#: one expression's stored transitions for the compiled lexer expansion (rowstore.py: byte masks, targets)
PACKED_BYTES = 400


def alternatives_bytes(alternatives) -> int:
    """The estimate for a rule's list of alternatives."""
    return 56 + ALT_BYTES * len(alternatives) + SYMBOL_BYTES * sum(map(len, alternatives))


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class CompileMemory:
    """The running estimate of one compile: ``total`` bytes, ``parts`` by name, against
    ``limit`` (``None``: unbounded, only measured). ``nodes``, ``derivs`` and ``rules`` count
    the regex nodes, derivatives and bytes of grammar rules not charged yet (see :meth:`flush`)."""

    __slots__ = ("limit", "parent", "total", "parts", "nodes", "derivs", "rules")

    def __init__(self, limit: int | None, parent: "CompileMemory | None" = None):
        self.limit = limit
        self.parent = parent
        self.total = 0
        self.parts: dict[str, int] = {}
        self.nodes = self.derivs = self.rules = 0

    def flush(self) -> None:
        """Charge the regex nodes, derivatives and grammar rules counted since the last flush."""
        n, d, r = self.nodes, self.derivs, self.rules
        self.nodes = self.derivs = self.rules = 0
        if r:
            self.charge("grammar rules", r)
        if n:
            self.charge("regex nodes", n * NODE_BYTES)
        if d:
            self.charge("regex derivatives", d * DERIV_BYTES)

    def charge(self, what: str, nbytes: int) -> None:
        m = self
        while m is not None:
            m.total += nbytes
            m.parts[what] = m.parts.get(what, 0) + nbytes
            if m.limit is not None and m.total > m.limit:
                m._exceeded(what)
            m = m.parent

    def _exceeded(self, what: str) -> None:
        shares = ", ".join(f"{k} {mib(v)}" for k, v in sorted(self.parts.items(), key=lambda kv: -kv[1]))
        raise GrammarMemoryError(
            f"the compile's memory bound was exceeded: {what} took the estimate of what the compile "
            f"holds to {mib(self.total)}, over max_compile_memory_bytes={self.limit} "
            f"({mib(self.limit)}; {shares})", what=what, used_bytes=self.total, limit_bytes=self.limit)


_active: ContextVar[CompileMemory | None] = ContextVar("grammask_compile_memory", default=None)


@contextmanager
def compile_memory_bound(limit: int | None):
    """Make a :class:`CompileMemory` of bound ``limit`` active in this thread for the block
    (within any active one) and yield it; what is left counted is charged at its end."""
    m = CompileMemory(limit, _active.get())
    token = _active.set(m)
    try:
        yield m
        m.flush()
    finally:
        _active.reset(token)


#: the active :class:`CompileMemory` of this thread, or None (``ExprSet`` counts into it)
current = _active.get


def charge(what: str, nbytes: int) -> None:
    """Add ``nbytes`` to the active compile's estimate under ``what`` (nothing when no compile
    is active: mask-time growth is bounded elsewhere)."""
    m = _active.get()
    if m is not None:
        m.charge(what, nbytes)


@contextmanager
def suspended():
    """No compile memory bound in this thread for the block (work bounded by its own limits,
    such as the lexeme DFAs of :mod:`.lexdfa`, which a compile may or may not need)."""
    token = _active.set(None)
    try:
        yield
    finally:
        _active.reset(token)
