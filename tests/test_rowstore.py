"""The per-ExprSet store of lexeme DFA rows (grammar/rowstore.py) and the kernel filling rows from it."""
from __future__ import annotations

import numpy as np

from grammask.grammar import lexdfa, rowstore
from grammask.grammar.lexer import Lexer
from grammask.grammar.regex import parse_regex
from grammask.grammar.regexset import ExprSet
from test_regexset import explore_same_automaton

PATTERNS = ("\\s*\"name\"", "\\s*[0-9]+(\\.[0-9]+)?", '"([^"\\\\]|\\\\.){0,12}"', "true|false", "[a-z]+é?")


def _decoded(store, e):
    a = store.arrays
    lo = int(a.first[e]) - 1
    out = []
    for j in range(lo, lo + int(a.count[e])):
        m = sum(int(a.mask[j, w]) << (64 * w) for w in range(4))
        out.append((m, int(a.tgt[j]), bool(a.null[j])))
    return out


def test_stored_rows_are_the_transitions():
    ex = ExprSet()
    words = [parse_regex(p, ex) for p in PATTERNS]
    store = rowstore.row_store(ex)
    assert rowstore.row_store(ex) is store
    # a few derivatives deep, so the ids grow past the store's first capacity
    todo, seen = list(words), set()
    while todo and len(seen) < 300:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        todo.extend(t for _m, t in ex.transitions(e))
    store.ensure(ex, sorted(seen))
    assert len(store) == len(seen)
    for e in seen:
        assert store.has(e)
        assert _decoded(store, e) == [(m, t, ex.nullable(t)) for m, t in ex.transitions(e)]
    store.ensure(ex, sorted(seen))   # stored once
    assert len(store) == store.added == len(seen)


def test_a_second_lexer_over_the_same_exprset_computes_no_derivative():
    """Rows are per expression, so a second grammar with the same lexemes (a compiler's grammars
    share most of theirs) writes its DFA rows from the store."""
    ex = ExprSet()
    words = [parse_regex(p, ex) for p in PATTERNS]
    first = Lexer(ex, words, eager=True)
    first.warm_up(first.start_state(list(range(len(words)))), budget=300)
    store = rowstore.row_store(ex)
    n_derivs, n_stored = len(ex._deriv), store.added
    second = Lexer(ex, words, eager=True)
    second.warm_up(second.start_state(list(range(len(words)))), budget=300)
    assert second.n_states == first.n_states > 20
    assert len(ex._deriv) == n_derivs and store.added == n_stored


def test_kernel_asks_for_room_and_writes_the_rows_before():
    _kernel_asks_for_room(0)


def test_the_rows_table_is_kept_while_it_has_the_rows():
    # g_next made longer than the other arrays (new_dfas' ``rows``) is kept by a regrowth that
    # it has the rows for (no copy: the costliest part of one), and copied past them
    X = _kernel_asks_for_room(16)
    Y = lexdfa.grow_dfas(X, 32)
    assert Y.g_next is not X.g_next and Y.g_next.shape[0] == 32 * 256
    n = int(X.g_cnt[0])
    assert np.array_equal(Y.g_next[:n * 256], X.g_next[:n * 256]) and Y.g_null.shape[0] == 32


def _kernel_asks_for_room(rows):
    ex = ExprSet()
    e = parse_regex("[a-c]x|[d-f]y|[g-i]z", ex)   # three transitions
    store = rowstore.row_store(ex)
    store.ensure(ex, [e])
    X = lexdfa.new_dfas(8, rows)   # capacities are powers of two (the pair hash's size)
    nxt = X.g_next
    g0, g1, g2 = (int(lexdfa.g_intern(X, e, lx, 0)) for lx in range(3))   # one expression, 3 lexemes
    queue = np.zeros(8, np.int64)
    # 3 states, then 3 new targets per row: the first row fits in 8 states, the second does not
    gs = np.array([g0, g1, g2], np.int64)
    st, k = rowstore.fill_stored_rows(gs, X, store.arrays, 0, queue)
    assert (st, k) == (rowstore.NEED_ROOM, 1)
    assert X.g_done[g0] and not X.g_done[g1] and int(X.g_cnt[0]) == 6
    X = lexdfa.grow_dfas(X, 16)
    assert (X.g_next is nxt) == (rows >= 16) and X.g_null.shape[0] == 16
    st, k = rowstore.fill_stored_rows(gs[k:], X, store.arrays, 0, queue)
    assert (st, k) == (rowstore.DONE, 2) and X.g_done[g1] and X.g_done[g2]
    for g, lx in ((g0, 0), (g1, 1), (g2, 2)):
        row = X.g_next[g * 256:(g + 1) * 256]
        for m, t in ex.transitions(e):
            for b in range(256):
                if (m >> b) & 1:
                    h = int(row[b])
                    assert X.g_expr[h] == t and X.g_lex[h] == lx
        allowed = {b for m, _t in ex.transitions(e) for b in range(256) if (m >> b) & 1}
        assert all((int(row[b]) >= 0) == (b in allowed) for b in range(256))
    return X


def test_the_store_starting_over_keeps_the_automaton(monkeypatch):
    """Past MAX_STORED_EXPRS the store starts over; the lexer built across restarts is the
    derivative construction's."""
    monkeypatch.setattr(rowstore, "MAX_STORED_EXPRS", 5)
    ex = ExprSet()
    words = [parse_regex(p, ex) for p in PATTERNS]
    fast = Lexer(ex, words, eager=True)
    ref = Lexer(ex, words, eager=False)
    everything = list(range(len(words)))
    seen = explore_same_automaton(fast, ref, fast.start_state(everything), ref.start_state(everything))
    assert len(seen) == fast.n_states == ref.n_states > 20
    assert rowstore.row_store(ex).added > 2 * len(rowstore.row_store(ex))   # it did start over


def test_a_dropped_exprset_is_freed_without_the_cyclic_collector():
    """The store lives on its ExprSet and holds no reference back: an ExprSet dropped with its
    lexers (a compiler starting a new shared set) is freed at once, not at the next full
    collection (a cycle there kept megabytes of dropped memo tables alive over a MaskBench pass)."""
    import gc
    import weakref

    was = gc.isenabled()
    gc.disable()
    try:
        ex = ExprSet()
        words = [parse_regex(p, ex) for p in PATTERNS]
        lx = Lexer(ex, words, eager=True)
        lx.warm_up(lx.start_state(list(range(len(words)))), budget=50)
        assert len(rowstore.row_store(ex)) > 0
        ref = weakref.ref(ex)
        del ex, lx, words
        assert ref() is None
    finally:
        if was:
            gc.enable()


def test_a_ladder_is_stored_with_its_top_and_only_as_deep_as_asked():
    """``ensure(..., ladder=k)`` stores, with ``c{0,h} y`` (leading whitespace) or ``c y`` (a
    key's bytes), the next ``k - 1`` rungs down the run (ExprSet.ladder_next), each row the same
    as its own transitions; a plain ``ensure`` stores the expression alone."""
    ex = ExprSet()
    ws = ex.repeat(ex.byteset(sum(1 << b for b in b" \t\n\r")), 0, 32)
    key = ex.literal(b'"name"')
    value = parse_regex("[0-9]+", ex)
    tops = [ex.concat(ws, key), ex.concat(ws, value), key]
    store = rowstore.row_store(ex)
    store.ensure(ex, [key])
    assert len(store) == 1
    store.ensure(ex, [key], ladder=4)    # stored already: nothing more (its rungs come when asked)
    assert len(store) == 1
    for top, k in zip(tops[:2], (20, 40)):
        store.ensure(ex, [top], ladder=k)
        rungs, e = [], top
        while e >= 0 and len(rungs) < 80:
            rungs.append(e)
            e = ex.ladder_next(e, ex.transitions(e))
        want = min(k, len(rungs))
        assert [store.has(r) for r in rungs[:want]] == [True] * want
        assert not any(store.has(r) for r in rungs[want:] if r != key)
        for r in rungs[:want]:
            assert _decoded(store, r) == [(m, t, ex.nullable(t)) for m, t in ex.transitions(r)]
    # the rungs: whitespace counts down to the lexeme; a key's bytes down to its last two
    e, n = ex.concat(ws, key), 0
    while e >= 0:
        n += 1
        e = ex.ladder_next(e, ex.transitions(e))
    assert n == 32 + len(b'"name"') - 1   # ws{0,32} .. ws{0,1}, then the key down to its last two bytes
    assert ex.ladder_next(value, ex.transitions(value)) == -1
    assert ex.ladder_next(ex.concat(ex.star(ex.byteset(1 << 32)), key), ()) == -1   # unbounded: no rungs


def test_subtree_depths_and_the_chain_frontiers_depth():
    """The greatest depth below each trie node (against a scan of the subtree), and
    ``chain_frontier``'s ``deep``: the most bytes the trie holds below an unexpanded state it
    reports."""
    from grammask.grammar.mask import chain_frontier
    from grammask.grammar.slicer import ForestArrays, subtree_depths
    from grammask.grammar.toktrie import TokTrie

    rng = np.random.default_rng(0)
    toks = sorted({bytes(rng.integers(97, 100, size=int(rng.integers(1, 9))).tolist()) for _ in range(300)})
    t = TokTrie.build(toks)
    d = subtree_depths(t.node_depth, t.node_end)
    for i in range(t.n_nodes):
        assert d[i] == t.node_depth[i:t.node_end[i]].max()
    F = ForestArrays(t.node_byte, t.node_depth, t.node_end, *([None] * 6))
    # a lexer whose states 0 and 1 are expanded and state 2 is not: the frontier is state 2, two
    # bytes below a chain's node, and ``deep`` the longest run of bytes below it
    trans = np.full(256 * 16, -1, np.int32)
    for s in range(16):
        trans[s * 256 + 97:s * 256 + 100] = s + 1 if s < 2 else -2
    for node in (t.child(0, 97), t.child(t.child(0, 98), 99)):
        pairs = np.array([node, 0], np.int32)
        out, deep = np.zeros(16, np.int32), np.zeros(1, np.int64)
        n = chain_frontier(F, trans, pairs, 1, np.zeros(t.max_depth + 2, np.int32), out, d, deep)
        assert n > 0 and set(out[:n].tolist()) == {2}
        # state 0 reads the node's byte, then states 1 and 2: state 2 is met two levels below
        at = t.node_depth[node] + 2
        below = [j for j in range(node + 1, t.node_end[node]) if t.node_depth[j] == at]
        assert deep[0] == max(d[j] - at + 1 for j in below) > 1
