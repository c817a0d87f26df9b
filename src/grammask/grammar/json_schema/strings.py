"""String escapes: the JSON-escaped spellings of decoded-string languages and of literal strings.

A string constraint is a regex over the *decoded* value (UTF-8 bytes); the grammar needs the
language of its JSON-escaped bodies. :class:`Strings` computes them (raw characters, the short
escapes, ``\\uXXXX`` for control and non-ASCII characters) with memo tables that live as long as
the ExprSet (they are shared by every schema compiled into it).
"""
from __future__ import annotations

import weakref

from ..builtin import JsonLexemes
from ..regexset import AND, BYTES, CONCAT, EMPTY, EPS, NOT, OR, REPEAT, ExprSet

__all__ = ["Strings"]


def _mask(bs: bytes) -> int:
    m = 0
    for b in bs:
        m |= 1 << b
    return m


_SHORT = {0x22: '\\"', 0x5C: "\\\\", 0x2F: "\\/", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def _byte_runs(m: int) -> list[tuple[int, int]]:
    """Maximal runs of consecutive bytes in the 256-bit set ``m``."""
    out = []
    b = 0
    while m >> b:
        if m >> b & 1:
            lo = b
            while m >> (b + 1) & 1:
                b += 1
            out.append((lo, b))
        b += 1
    return out


class Strings:
    """JSON string encodings of decoded-string languages."""

    def __init__(self, ex: ExprSet, lx: JsonLexemes):
        from ..regex import any_utf8_char, any_utf8_string, char_class_expr

        # weak: the ExprSet keeps this object among its shared compile tables (see
        # json_schema/state.py); a strong reference back would make the pair a cycle, and a
        # dropped ExprSet (millions of nodes) would wait for a full garbage collection, which
        # then frees it inside whatever mask is running
        self._ex = weakref.ref(ex)
        self.quote = ex.literal('"')
        self.body_full = ex.star(lx.string_char)
        self.any_char = any_utf8_char(ex)
        self.any_dec = any_utf8_string(ex)
        hexd = ex.byteset(_mask(b"0123456789abcdefABCDEF"))
        self.hexd = hexd
        raw = char_class_expr([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)], ex)
        short = ex.concat(ex.literal("\\"), ex.byteset(_mask(b'"\\/bfnrt')))
        nonsur = ex.alt(ex.concat(ex.byteset(_mask(b"0123456789abcefABCEF")), ex.repeat(hexd, 3, 3)),
                        ex.concat(ex.byteset(_mask(b"dD")), ex.byteset(_mask(b"01234567")), ex.repeat(hexd, 2, 2)))
        pair = ex.concat(ex.literal("\\u"), ex.byteset(_mask(b"dD")), ex.byteset(_mask(b"89abAB")),
                         ex.repeat(hexd, 2, 2), ex.literal("\\u"), ex.byteset(_mask(b"dD")),
                         ex.byteset(_mask(b"cdefCDEF")), ex.repeat(hexd, 2, 2))
        self.unit = ex.alt(raw, short, ex.concat(ex.literal("\\u"), nonsur), pair)
        self.raw_ascii = sum(1 << b for b in range(0x20, 0x80) if b not in (0x22, 0x5C))
        self._esc: dict[int, int] = {}
        self._enc: dict[int, int] = {}
        self._chars: dict[int, object] = {}
        self._maxlen: dict[int, float] = {}
        self._lit: dict[tuple, int] = {}
        self._lit_chars: dict[tuple, int] = {}
        self.body_restricted = None
        self.body_restricted = self.enc(self.any_dec)

    @property
    def ex(self) -> ExprSet:
        """The ExprSet (alive as long as this object is reachable: only through its tables)."""
        return self._ex()

    def _hex_ci(self, text: str) -> int:
        ex = self.ex
        parts = []
        for c in text:
            if c.isalpha():
                parts.append(ex.byteset(_mask(c.lower().encode()) | _mask(c.upper().encode())))
            else:
                parts.append(ex.literal(c))
        return ex.concat(*parts)

    def _u(self, cp: int) -> int:
        ex = self.ex
        if cp < 0x10000:
            return ex.concat(ex.literal("\\u"), self._hex_ci(f"{cp:04x}"))
        v = cp - 0x10000
        hi, lo = 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)
        return ex.concat(ex.literal("\\u"), self._hex_ci(f"{hi:04x}"), ex.literal("\\u"), self._hex_ci(f"{lo:04x}"))

    def ascii_escapes(self, b: int) -> int:
        """Escaped spellings of ASCII byte ``b`` used in constrained strings."""
        e = self._esc.get(b)
        if e is None:
            ex = self.ex
            parts = []
            if b in _SHORT:
                parts.append(ex.literal(_SHORT[b]))
            if b < 0x20 or b == 0x7F:
                parts.append(self._u(b))
            e = self._esc[b] = ex.alt(*parts)
        return e

    # ------------------------------------------------------------------ \uXXXX of character sets
    def _len_bounds(self, e: int) -> tuple:
        r = self._maxlen.get(e)
        if r is not None:
            return r
        ex = self.ex
        k = ex.kind[e]
        if k == EMPTY:
            r = (0, 0)
        elif k == EPS:
            r = (0, 0)
        elif k == BYTES:
            r = (1, 1)
        elif k == CONCAT:
            a, b = (self._len_bounds(x) for x in ex.args[e])
            r = (a[0] + b[0], a[1] + b[1])
        elif k == OR:
            bs = [self._len_bounds(x) for x in ex.args[e]]
            r = (min(b[0] for b in bs), max(b[1] for b in bs))
        elif k == REPEAT:
            x, lo, hi = ex.args[e]
            b = self._len_bounds(x)
            r = (b[0] * lo, float("inf") if hi == -1 else b[1] * hi)
        else:
            r = (0, float("inf"))
        self._maxlen[e] = r
        return r

    def char_ranges(self, e: int):
        """Code point ranges if ``e`` denotes a set of single characters, else None."""
        if e in self._chars:
            return self._chars[e]
        r = None
        lo_len, hi_len = self._len_bounds(e)
        if 1 <= lo_len and hi_len <= 4:
            r = self._explore_chars(e)
        self._chars[e] = r
        return r

    def _explore_chars(self, e: int):
        ex = self.ex
        paths = []
        stack = [(e, ())]
        n = 0
        while stack:
            x, path = stack.pop()
            n += 1
            if n > 400:
                return None
            tr = ex.transitions(x)
            if ex.nullable(x):
                if not path or tr:
                    return None
                paths.append(path)
                continue
            if len(path) >= 4:
                return None
            for m, t in tr:
                stack.append((t, path + (m,)))
        ranges = []
        work = 0
        cont_full = ((1 << 0xC0) - 1) ^ ((1 << 0x80) - 1)
        for path in paths:
            first = path[0]
            n = len(path)
            lead_ok = {1: (0x00, 0x7F), 2: (0xC2, 0xDF), 3: (0xE0, 0xEF), 4: (0xF0, 0xF4)}[n]
            if first >> (lead_ok[1] + 1) or first & ((1 << lead_ok[0]) - 1):
                return None
            for m in path[1:]:
                if m & ~cont_full:
                    return None
            # positions from ``j`` on are all full continuation sets: iterate single bytes before
            # ``j - 1`` and runs of bytes at ``j - 1`` (each run is one contiguous code point range)
            j = n
            while j > 1 and path[j - 1] == cont_full:
                j -= 1
            runs_at = [_byte_runs(m) for m in path]
            prefixes = [()]
            for k in range(j - 1):
                prefixes = [pre + (b,) for pre in prefixes for lo, hi in runs_at[k] for b in range(lo, hi + 1)]
                work += len(prefixes)
                if work > 200_000:
                    return None
            tail_lo, tail_hi = (0x80,) * (n - j), (0xBF,) * (n - j)
            for pre in prefixes:
                for lo, hi in runs_at[j - 1]:
                    a = bytes(pre + (lo,) + tail_lo).decode("utf-8", "surrogatepass")
                    b = bytes(pre + (hi,) + tail_hi).decode("utf-8", "surrogatepass")
                    ranges.append((ord(a), ord(b)))
        merged: list = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                if hi > merged[-1][1]:
                    merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        return merged

    def _hex_range(self, lo: int, hi: int, width: int = 4) -> int:
        """Hex digit strings (any letter case) of ``width`` digits with value in [lo, hi]."""
        ex = self.ex
        digs = "0123456789abcdef"

        def dset(a: int, b: int) -> int:
            m = 0
            for d in range(a, b + 1):
                m |= _mask(digs[d].encode()) | _mask(digs[d].upper().encode())
            return ex.byteset(m)

        def fixed(a: str, b: str) -> int:
            if not a:
                return EPS
            n = len(a) - 1
            x, y = int(a[0], 16), int(b[0], 16)
            if x == y:
                return ex.concat(dset(x, x), fixed(a[1:], b[1:]))
            parts = []
            lo_full = a[1:] == "0" * n
            hi_full = b[1:] == "f" * n
            if not lo_full:
                parts.append(ex.concat(dset(x, x), fixed(a[1:], "f" * n)))
            ml, mh = (x if lo_full else x + 1), (y if hi_full else y - 1)
            if ml <= mh:
                parts.append(ex.concat(dset(ml, mh), ex.repeat(dset(0, 15), n, n)))
            if not hi_full:
                parts.append(ex.concat(dset(y, y), fixed("0" * n, b[1:])))
            return ex.alt(*parts)

        try:
            return fixed(f"{lo:0{width}x}", f"{hi:0{width}x}")
        finally:
            fixed = None  # break the closure's reference cycle

    def u_escapes(self, ranges) -> int:
        """``\\uXXXX`` spellings (surrogate pairs above U+FFFF) of the non-ASCII code points."""
        ex = self.ex
        u = ex.literal("\\u")
        parts = []
        for lo, hi in ranges:
            lo = max(lo, 0x80)
            if lo > hi:
                continue
            if lo <= 0xFFFF:
                parts.append(ex.concat(u, self._hex_range(lo, min(hi, 0xFFFF))))
            if hi >= 0x10000:
                a, b = max(lo, 0x10000) - 0x10000, hi - 0x10000
                ha, hb = 0xD800 + (a >> 10), 0xD800 + (b >> 10)
                la, lb = 0xDC00 + (a & 0x3FF), 0xDC00 + (b & 0x3FF)
                if ha == hb:
                    parts.append(ex.concat(u, self._hex_range(ha, ha), u, self._hex_range(la, lb)))
                else:
                    parts.append(ex.concat(u, self._hex_range(ha, ha), u, self._hex_range(la, 0xDFFF)))
                    if ha + 1 <= hb - 1:
                        parts.append(ex.concat(u, self._hex_range(ha + 1, hb - 1), u, self._hex_range(0xDC00, 0xDFFF)))
                    parts.append(ex.concat(u, self._hex_range(hb, hb), u, self._hex_range(0xDC00, lb)))
        return ex.alt(*parts)

    def _char_prefix(self, e: int):
        """Split ``lead cont... rest`` (a multi-byte character at the head of a concatenation
        chain) into (character set, rest), or None."""
        ex = self.ex
        x, y = ex.args[e]
        if ex.kind[x] != BYTES:
            return None
        m = ex.args[x][0]
        for n, (a, b) in ((2, (0xC2, 0xDF)), (3, (0xE0, 0xEF)), (4, (0xF0, 0xF4))):
            if m and not (m >> (b + 1)) and not (m & ((1 << a) - 1)):
                break
        else:
            return None
        conts = []
        rest = y
        for _ in range(n - 1):
            if ex.kind[rest] == CONCAT:
                c, rest = ex.args[rest]
            elif ex.kind[rest] == BYTES:
                c, rest = rest, EPS
            else:
                return None
            if ex.kind[c] != BYTES:
                return None
            conts.append(c)
        return ex.concat(x, *conts), rest

    def enc(self, e: int) -> int:
        """The JSON-escaped bodies of the decoded strings of ``e``: raw characters, the usual
        escapes of ASCII, ``\\uXXXX`` of control and non-ASCII characters."""
        r = self._enc.get(e)
        if r is not None:
            return r
        ex = self.ex
        k = ex.kind[e]
        if k in (OR, CONCAT):
            cr = self.char_ranges(e)
            if cr is not None:
                r = ex.alt(self._enc_struct(e, self._enc_raw), self.u_escapes(cr))
                self._enc[e] = r
                return r
            if k == CONCAT:
                split = self._char_prefix(e)
                if split is not None:
                    r = ex.concat(self.enc(split[0]), self.enc(split[1]))
                    self._enc[e] = r
                    return r
        r = self._enc_struct(e, self.enc)
        self._enc[e] = r
        return r

    def _enc_raw(self, e: int) -> int:
        """Like :meth:`enc` without ``\\uXXXX`` for non-ASCII (inside a character set that
        gets them as a whole)."""
        return self._enc_struct(e, self._enc_raw)

    def _enc_struct(self, e: int, rec) -> int:
        ex = self.ex
        k = ex.kind[e]
        if k == EMPTY or k == EPS:
            r = e
        elif k == BYTES:
            m = ex.args[e][0]
            keep = m & (self.raw_ascii | (((1 << 256) - 1) ^ ((1 << 128) - 1)))
            parts = [ex.byteset(keep)]
            special = m & ~keep & ((1 << 128) - 1)
            while special:
                low = special & -special
                parts.append(self.ascii_escapes(low.bit_length() - 1))
                special ^= low
            r = ex.alt(*parts)
        elif k == CONCAT:
            a, b = ex.args[e]
            r = ex.concat(rec(a), rec(b))
        elif k == OR:
            r = ex.alt(*[rec(x) for x in ex.args[e]])
        elif k == AND:
            r = ex.intersect(*[rec(x) for x in ex.args[e]])
        elif k == NOT:
            r = ex.intersect(ex.complement(rec(ex.args[e][0])), self.body_restricted)
        elif k == REPEAT:
            x, lo, hi = ex.args[e]
            r = ex.repeat(rec(x), lo, None if hi == -1 else hi)
        else:  # pragma: no cover
            raise AssertionError(k)
        return r

    def literal(self, s: str, full: bool) -> int:
        """Spellings of string ``s`` (body, without quotes). ``full``: every JSON spelling;
        otherwise raw/short escapes, ``\\uXXXX`` for control and non-ASCII characters."""
        key = (s, full)
        r = self._lit.get(key)
        if r is None:
            ex = self.ex
            if not full and s.isascii() and s.isprintable() and '"' not in s and "\\" not in s and "/" not in s:
                # printable ASCII without a character that has an escape: spelled only raw
                r = ex.concat(*ex.single_bytes(s.encode("ascii")))
            else:
                r = ex.concat(*[self._char_forms(ch, full) for ch in s])
            self._lit[key] = r
        return r

    def _char_forms(self, ch: str, full: bool) -> int:
        key = (ch, full)
        r = self._lit_chars.get(key)
        if r is None:
            ex = self.ex
            cp = ord(ch)
            forms = []
            if cp >= 0x20 and ch not in '"\\' and not (0xD800 <= cp <= 0xDFFF):
                forms.append(ex.literal(ch.encode("utf-8")))
            if cp in _SHORT:
                forms.append(ex.literal(_SHORT[cp]))
            if full or not (0x20 <= cp < 0x7F):
                forms.append(self._u(cp))
            r = self._lit_chars[key] = ex.alt(*forms)
        return r

