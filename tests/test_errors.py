"""Typed errors through the public API (issue 2, §6.5).

Invalid EBNF (with line:column), undefined rules, empty languages, unsupported regex constructs
(with position), bitmask misuse and rollback too far (MatcherError), and grammars with huge bounded
repeats, which must raise GrammarTooComplexError (or compile) within a time budget, never hang.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager

import numpy as np
import pytest

from grammask import (
    GrammarCompiler,
    GrammarMatcher,
    TokenizerInfo,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    errors,
)
from grammask.errors import (
    EmptyLanguageError,
    GrammarError,
    GrammarSyntaxError,
    GrammarTooComplexError,
    GrammaskError,
    MatcherError,
    RegexSyntaxError,
    UndefinedRuleError,
    UnsupportedRegexError,
)

TIME_BUDGET_S = 30


@pytest.fixture(scope="module")
def comp():
    toks = [b""] + [bytes([b]) for b in range(256)] + [b"ab", b"abc", b"hello", b" world", b'{"', b'":']
    info = TokenizerInfo(toks, stop_token_ids=[0])
    return GrammarCompiler(info)


@contextmanager
def time_budget(seconds: int = TIME_BUDGET_S):
    """Fail (instead of hanging) when the block runs longer than ``seconds`` (pure-Python work)."""

    def on_alarm(signum, frame):
        raise TimeoutError(f"took over {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_error_hierarchy():
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), GrammaskError)
    for cls in (GrammarSyntaxError, UndefinedRuleError, RegexSyntaxError, UnsupportedRegexError,
                EmptyLanguageError, GrammarTooComplexError):
        assert issubclass(cls, GrammarError) and issubclass(cls, ValueError)
    assert issubclass(UndefinedRuleError, GrammarSyntaxError)
    assert issubclass(UnsupportedRegexError, RegexSyntaxError)
    assert issubclass(MatcherError, RuntimeError)


# ---------------------------------------------------------------------------------------------- EBNF
@pytest.mark.parametrize(
    "text,line,column",
    [
        ('root ::= "a" |\n  "b" )', 2, 7),                   # unbalanced ')'
        ('root ::= "abc', 1, 10),                            # unterminated literal: where it opens
        ("root ::= [a-", 1, 10),                             # unterminated class
        ('root := "a"', 1, 6),                               # '::=' misspelt
        ('root ::= "a"{3,2}', 1, 13),                        # reversed repetition range
        ('root ::= "\\q"', 1, 11),                           # bad escape: its backslash
        ('root ::= "a"**', 1, 14),                           # stacked quantifiers
        ('# comment\nroot ::= x\n\nx ::= "a" (\n  "b"', 4, 11),  # unclosed '(' on line 4
        ('root ::= "日本" @', 1, 15),                         # columns count code points
    ],
)
def test_invalid_ebnf_has_line_and_column(comp, text, line, column):
    with pytest.raises(GrammarSyntaxError) as ei:
        comp.compile_grammar(text)
    e = ei.value
    assert (e.line, e.column) == (line, column), str(e)
    assert f"{line}:{column}" in str(e)


def test_undefined_rule(comp):
    with pytest.raises(UndefinedRuleError) as ei:
        comp.compile_grammar('root ::= "(" items ")"\nitems ::= item ("," item)*')
    e = ei.value
    assert (e.line, e.column) == (2, 11) and "'item'" in str(e)
    with pytest.raises(UndefinedRuleError):
        comp.compile_grammar('main ::= "a"')  # no root rule


def test_duplicate_rule(comp):
    with pytest.raises(GrammarSyntaxError) as ei:
        comp.compile_grammar('root ::= "a"\nroot ::= "b"')
    assert (ei.value.line, ei.value.column) == (2, 1)


def test_errors_are_not_cached(comp):
    for _ in range(2):
        with pytest.raises(GrammarSyntaxError):
            comp.compile_grammar('root ::= "a" )')
        with pytest.raises(UnsupportedRegexError):
            comp.compile_regex("a(?=b)")


# ---------------------------------------------------------------------------------------------- empty languages
@pytest.mark.parametrize("kind,src", [
    ("regex", "[]"),
    ("regex", "a[]b|[]"),
    ("ebnf", "root ::= []"),
    ("ebnf", 'root ::= "a" root'),                                    # only infinite derivations
    ("ebnf", 'root ::= x\nx ::= "a" y\ny ::= "b" x'),                 # mutually unproductive
    ("ebnf", 'root ::= x | [] "a"\nx ::= x "b"'),
])
def test_empty_language(comp, kind, src):
    with pytest.raises(EmptyLanguageError):
        comp.compile_regex(src) if kind == "regex" else comp.compile_grammar(src)


def test_unproductive_alternatives_are_dropped_not_an_error(comp):
    m = GrammarMatcher(comp.compile_grammar('root ::= "a" | "b" x\nx ::= "c" x'))
    assert m.find_jump_forward_string() == "a"


# ---------------------------------------------------------------------------------------------- regex
@pytest.mark.parametrize("pattern,construct,position", [
    ("a(?=b)", "lookahead", 1),
    ("(a|(?!x)y)", "lookahead", 3),
    ("(?<=a)b", "lookbehind", 0),
    ("x(?<!a)b", "lookbehind", 1),
    ("(a)\\1", "backreference", 3),
    ("\\bfoo", "\\b", 0),
    ("ab\\B", "\\B", 2),
    ("(?i)a", "inline flags", 0),
])
def test_unsupported_regex_constructs(comp, pattern, construct, position):
    with pytest.raises(UnsupportedRegexError) as ei:
        comp.compile_regex(pattern)
    e = ei.value
    assert e.position == position, str(e)
    assert construct in e.construct
    assert e.pattern == pattern


@pytest.mark.parametrize("pattern,position", [("x(", 1), ("a**", 2), ("[z-a]", 1), ("a)", 1), ("[ab", 0)])
def test_regex_syntax_errors(comp, pattern, position):
    with pytest.raises(RegexSyntaxError) as ei:
        comp.compile_regex(pattern)
    assert not isinstance(ei.value, UnsupportedRegexError)
    assert ei.value.position == position, str(ei.value)


def test_regex_macro_in_ebnf_reports_the_grammar_position(comp):
    with pytest.raises(GrammarSyntaxError) as ei:
        comp.compile_grammar('root ::= "x"\n  Regex("a(?=b)")')
    assert ei.value.line == 2


# ---------------------------------------------------------------------------------------------- matcher misuse
def test_bad_bitmask_dtype_and_shape(comp):
    m = GrammarMatcher(comp.compile_regex("ab+"))
    V = m.vocab_size
    good = allocate_token_bitmask(2, V)
    m.fill_next_token_bitmask(good, 1)
    for bad, index in [
        (good.astype(np.int64), 0),
        (good.astype(np.uint8), 0),
        (good.astype(np.float32), 0),
        (np.zeros((2, (V + 31) // 32 - 1), np.int32), 0),                  # one word short
        (np.zeros((2, 2 * ((V + 31) // 32)), np.int32)[:, ::2], 0),        # non-contiguous row
        (np.zeros((V + 31) // 32, np.int32), 1),                           # 1-D with index 1
    ]:
        with pytest.raises(MatcherError):
            m.fill_next_token_bitmask(bad, index)
    with pytest.raises((MatcherError, IndexError)):
        m.fill_next_token_bitmask(good, 2)
    logits = np.zeros((2, V), np.float32)
    with pytest.raises(MatcherError):
        apply_token_bitmask_inplace(logits, good.astype(np.int64))


def test_bad_torch_bitmask(comp):
    torch = pytest.importorskip("torch")
    m = GrammarMatcher(comp.compile_regex("ab+"))
    bm = allocate_token_bitmask(1, m.vocab_size, backend="torch")
    m.fill_next_token_bitmask(bm, 0)
    with pytest.raises(MatcherError):
        m.fill_next_token_bitmask(bm.to(torch.int64), 0)
    with pytest.raises(MatcherError):
        apply_token_bitmask_inplace(torch.zeros(1, m.vocab_size), bm.to(torch.int64))


def test_rollback_too_far(comp):
    m = GrammarMatcher(comp.compile_regex("[a-z]+"))
    with pytest.raises(MatcherError):
        m.rollback(1)
    assert m.accept_string("ab") and m.accept_token(ord("c") + 1)
    with pytest.raises(MatcherError):
        m.rollback(3)
    with pytest.raises(MatcherError):
        m.rollback(-1)
    m.rollback(2)  # the failed calls changed nothing
    with pytest.raises(MatcherError):
        m.rollback(1)


# ---------------------------------------------------------------------------------------------- too complex
@pytest.mark.parametrize("kind,src", [
    ("regex", "a{100001}"),
    ("regex", "(ab){3,100001}"),
    ("ebnf", 'root ::= "a"{200000}'),
    ("ebnf", 'root ::= x{0,99999}\nx ::= "a" | "b" x'),                 # rule references: expanded
    ("ebnf", 'root ::= x | x root\nx ::= "a"{1,50000}'),               # repeat split into rules
    ("ebnf", "root ::= " + "(" * 5000 + '"a"' + ")" * 5000),            # nesting depth
])
def test_huge_bounded_repeats_raise_quickly(comp, kind, src):
    t0 = time.perf_counter()
    with time_budget(), pytest.raises(GrammarTooComplexError):
        comp.compile_regex(src) if kind == "regex" else comp.compile_grammar(src)
    assert time.perf_counter() - t0 < TIME_BUDGET_S


@pytest.mark.parametrize("kind,src", [
    ("regex", r"[\p{L}]{100000}"),
    ("regex", "(a{1,100000}){1,100000}"),
    ("ebnf", 'root ::= x{9000}\nx ::= "a" | "(" x ")"'),
])
def test_large_but_lazy_repeats_compile(comp, kind, src):
    with time_budget():
        cg = comp.compile_regex(src) if kind == "regex" else comp.compile_grammar(src)
        m = GrammarMatcher(cg)
        m.get_next_token_bitmask()
        assert m.accept_string("a")
        m.get_next_token_bitmask()


# Each case runs in a fresh interpreter: it must compile and fill two masks, or raise
# GrammarTooComplexError, within HEAVY_BUDGET_S measured inside the interpreter (the engine's own
# compile-time limit is 30 s, so this leaves a margin for a loaded 2-core machine); the process is
# killed after HEAVY_KILL_S.
HEAVY_BUDGET_S = 60
HEAVY_KILL_S = 90
HEAVY = [
    # the lexeme split of "a"{1,n} into n rules: lowering is quadratic in n (_follow_sets)
    ("ebnf", 'root ::= x | x root\nx ::= "a"{1,15000}'),
    # the first mask explored a lexer DFA with exponentially many states (slicer containment)
    ("regex", r"(.{1,60}x){1,100}"),
    ("ebnf", 'root ::= x | x root\nx ::= [a-z]{1,3000}'),
    ("ebnf", 'root ::= (x " "?){1,9000}\nx ::= [0-9]+'),
    # the first mask: slicer containment (ExprSet.prefixes_contain) on huge counted derivatives
    ("regex", r"([^x]{1,99999}|x){99999}"),
    ("regex", r"((ab|a){1,1000}c){1,1000}"),
]

_HEAVY_SCRIPT = textwrap.dedent("""
    import sys, time
    from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
    from grammask.errors import GrammarTooComplexError
    toks = [b""] + [bytes([b]) for b in range(256)] + [b"aa", b"ab", b"aaaa", b"abc"]
    comp = GrammarCompiler(TokenizerInfo(toks, stop_token_ids=[0]))
    kind, src = sys.argv[1], sys.argv[2]
    t0 = time.perf_counter()
    try:
        cg = comp.compile_regex(src) if kind == "regex" else comp.compile_grammar(src)
        m = GrammarMatcher(cg)
        m.get_next_token_bitmask()
        m.accept_string("a")
        m.get_next_token_bitmask()
        print("COMPILED", time.perf_counter() - t0)
    except GrammarTooComplexError as e:
        print("TOO_COMPLEX", time.perf_counter() - t0, e)
""")


@pytest.mark.slow
@pytest.mark.parametrize("kind,src", HEAVY, ids=[f"heavy{i}" for i in range(len(HEAVY))])
def test_heavy_grammars_never_hang(kind, src):
    env = dict(os.environ)
    src_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src_dir + os.pathsep + env.get("PYTHONPATH", "")
    try:
        out = subprocess.run([sys.executable, "-c", _HEAVY_SCRIPT, kind, src], capture_output=True, text=True,
                             timeout=HEAVY_KILL_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind} {src!r}: neither compiled nor raised GrammarTooComplexError within {HEAVY_KILL_S} s")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(("COMPILED", "TOO_COMPLEX")), out.stdout
    elapsed = float(out.stdout.split()[1])
    assert elapsed < HEAVY_BUDGET_S, f"{kind} {src!r}: {out.stdout.strip()} (over {HEAVY_BUDGET_S} s)"


def test_input_nested_past_recursion_is_a_typed_error(comp):
    """Inputs deeper than any front end's recursion give GrammarTooComplexError, not RecursionError
    (and the compiler keeps working afterwards)."""
    deep_schema: dict = {}
    for _ in range(900):
        deep_schema = {"type": "array", "items": deep_schema}
    cases = [
        lambda: comp.compile_regex("(" * 3000 + "a" + ")" * 3000),
        lambda: comp.compile_regex("(?:" * 3000 + "a" + ")" * 3000),
        lambda: comp.compile_json_schema(deep_schema),
    ]
    for make in cases:
        with pytest.raises(GrammarTooComplexError, match="nested too deeply"):
            make()
    m = GrammarMatcher(comp.compile_regex("(a|b)+"))
    assert m.accept_string("abba") and m.can_terminate()
