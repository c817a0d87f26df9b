"""JSON Schema string ``format`` values as exact regular expressions over the decoded string.

Each supported format is an ECMA-262 pattern (full match) written from its RFC grammar; the
languages are subsets of what the RFCs allow where a detail is not regular or not worth it, never
supersets, so a generated value is always valid:

``date``, ``time``, ``date-time`` (RFC 3339 ``full-date``, ``full-time``, ``date-time``)
    days checked per month, 29 February only in leap years (Gregorian rule), year 0000 excluded;
    upper-case ``T``/``Z`` only; leap seconds (``:60``) are not generated.
``duration``       RFC 3339 appendix A (ISO 8601 durations).
``email``          RFC 5321 dot-atom local part (at most 64 bytes) ``@`` a ``hostname`` (no quoted
                   local parts, no address literals; the 254-byte total is not enforced).
``hostname``       RFC 1123 labels of 1-63 letters, digits and inner hyphens, 253 bytes at most.
``ipv4``           dotted quad without leading zeros; ``ipv6``: RFC 4291 text forms (RFC 3986
                   ``IPv6address``), no zone index.
``uuid``           RFC 4122 ``8-4-4-4-12`` hex digits.
``uri``, ``uri-reference``   RFC 3986 ``URI`` / ``URI-reference`` (ASCII; IRIs are not generated).
``json-pointer``, ``relative-json-pointer``   RFC 6901 / the relative JSON pointer draft.

Unknown formats are annotations (JSON Schema 2019-09+ "format-annotation"): :func:`format_expr`
returns ``None`` for them and the caller decides.
"""
from __future__ import annotations

import threading

from ..regexset import ExprSet

__all__ = ["FORMATS", "format_expr", "INT_FORMATS"]

_YEAR = r"(?:\d{3}[1-9]|\d{2}[1-9]0|\d[1-9]00|[1-9]000)"
_LEAP = r"(?:\d{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    rf"|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP}-02-29)"
)
_TIME = r"(?:(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))"
_DURATION = (
    r"P(?:(?:\d+Y(?:\d+M(?:\d+D)?)?|\d+M(?:\d+D)?|\d+D)(?:T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S))?"
    r"|T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)|\d+W)"
)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# (the last label must also contain a letter: see _hostname_expr)
_HOSTNAME = rf"(?:(?:{_LABEL}\.)*{_LABEL})"
# IDNA-safe ASCII labels: letters/digits with single inner hyphens
_IDN_LABEL = r"[A-Za-z0-9]{1,63}(?:-[A-Za-z0-9]+)*"
_IDN_HOSTNAME = rf"(?:(?:{_IDN_LABEL}\.)*{_IDN_LABEL})"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_EMAIL = rf"{_ATEXT}+(?:\.{_ATEXT}+)*@{_HOSTNAME}"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"(?:{_OCTET}(?:\.{_OCTET}){{3}})"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    h = _H16
    forms = [
        rf"(?:{h}:){{6}}{_LS32}",
        rf"::(?:{h}:){{5}}{_LS32}",
        rf"(?:{h})?::(?:{h}:){{4}}{_LS32}",
        rf"(?:(?:{h}:){{0,1}}{h})?::(?:{h}:){{3}}{_LS32}",
        rf"(?:(?:{h}:){{0,2}}{h})?::(?:{h}:){{2}}{_LS32}",
        rf"(?:(?:{h}:){{0,3}}{h})?::{h}:{_LS32}",
        rf"(?:(?:{h}:){{0,4}}{h})?::{_LS32}",
        rf"(?:(?:{h}:){{0,5}}{h})?::{h}",
        rf"(?:(?:{h}:){{0,6}}{h})?::",
    ]
    return "(?:" + "|".join(forms) + ")"


_IPV6 = _ipv6()
_UUID = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"

# RFC 3986
_UNRES = r"A-Za-z0-9\-._~"
_SUBD = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRES}{_SUBD}:@]|{_PCT})"
_SCHEME = r"[A-Za-z][A-Za-z0-9+\-.]*"
_USERINFO = rf"(?:[{_UNRES}{_SUBD}:]|{_PCT})*"
_REGNAME = rf"(?:[{_UNRES}{_SUBD}]|{_PCT})*"
_IPFUTURE = rf"v[0-9A-Fa-f]+\.[{_UNRES}{_SUBD}:]+"
_HOST = rf"(?:\[(?:{_IPV6}|{_IPFUTURE})\]|{_IPV4}|{_REGNAME})"
_AUTHORITY = rf"(?:{_USERINFO}@)?{_HOST}(?::\d*)?"
_SEGMENT = rf"{_PCHAR}*"
_SEGMENT_NZ = rf"{_PCHAR}+"
_SEGMENT_NZ_NC = rf"(?:[{_UNRES}{_SUBD}@]|{_PCT})+"
_PATH_ABEMPTY = rf"(?:/{_SEGMENT})*"
_PATH_ABSOLUTE = rf"/(?:{_SEGMENT_NZ}(?:/{_SEGMENT})*)?"
_PATH_ROOTLESS = rf"{_SEGMENT_NZ}(?:/{_SEGMENT})*"
_PATH_NOSCHEME = rf"{_SEGMENT_NZ_NC}(?:/{_SEGMENT})*"
_QUERY = rf"(?:{_PCHAR}|[/?])*"
_HIER = rf"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_ROOTLESS}|)"
_URI = rf"{_SCHEME}:{_HIER}(?:\?{_QUERY})?(?:#{_QUERY})?"
_RELATIVE = rf"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_NOSCHEME}|)(?:\?{_QUERY})?(?:#{_QUERY})?"
_URI_REF = rf"(?:{_URI}|{_RELATIVE})"

_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"

# RFC 6570 URI templates (level 4 syntax)
_VARCHAR = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})"
_VARNAME = rf"{_VARCHAR}(?:\.?{_VARCHAR})*"
_VARSPEC = rf"{_VARNAME}(?::[1-9]\d{{0,3}}|\*)?"
_TEMPLATE_LIT = r"(?:[!#$&()*+,\-./0-9:;=?@A-Z\[\]_a-z~]|%[0-9A-Fa-f]{2}|[^\x00-\x7f])"
_URI_TEMPLATE = rf"(?:{_TEMPLATE_LIT}|\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\}})*"


def _counted_range() -> str:
    """``{n,m}`` with ``n <= m`` (both without leading zeros, at most 4 digits): ``m`` longer
    than ``n``, or both of one or two digits with ``n <= m`` (equal lengths of 3-4 digits would
    need the regex to remember ``n``'s digits: left out, so such a quantifier is refused)."""
    num = [r"\d", r"[1-9]\d", r"[1-9]\d\d", r"[1-9]\d\d\d"]
    alts = []
    for i in range(3):                    # n has i + 1 digits, m more
        for j in range(i + 1, 4):
            alts.append(rf"{num[i]},{num[j]}")
    for a in range(10):                   # one digit each
        alts.append(rf"{a},[{a}-9]")
    for a in range(1, 10):                # two digits each
        if a < 9:
            alts.append(rf"{a}\d,[{a + 1}-9]\d")
        for b in range(10):
            alts.append(rf"{a}{b},{a}[{b}-9]")
    return r"\{(?:" + "|".join(alts) + r")\}"


def _regex_subset(depth: int = 3) -> str:
    """A regular subset of the regular expressions valid for both Python ``re`` and ECMA-262:
    literals, common escapes, classes with ordered ASCII ranges, ``.``, ``^``/``$``, groups
    ``(...)``/``(?:...)`` nested up to ``depth``, ``|`` and single quantifiers
    (``* + ? {n} {n,}`` and ``{n,m}`` with ``n <= m`` as :func:`_counted_range` spells it,
    optionally lazy)."""
    char = r"[^\\^$.|?*+()\[\]{}]"
    esc = r"\\[dDwWsSnrtf.\\^$|?*+()\[\]{}/]"
    rng = "|".join(f"{a}-{b}" for grp in ("0123456789", "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
                   for i, a in enumerate(grp) for b in grp[i:])
    citem = rf"(?:[^\\\]\[^\-]|\\[dDwWsSnrtf.\\^$|?*+()\[\]{{}}/\-]|{rng})"
    cls = rf"\[\^?{citem}+\]"
    quant = rf"(?:(?:[*+?]|\{{\d{{1,4}},?\}}|{_counted_range()})\??)"
    atom = rf"(?:{char}|{esc}|{cls}|\.)"
    alt = rf"(?:(?:{atom}{quant}?|[\^$])*(?:\|(?:{atom}{quant}?|[\^$])*)*)"
    for _ in range(depth):
        group = rf"\((?:\?:)?{alt}\)"
        atom2 = rf"(?:{atom}|{group})"
        alt = rf"(?:(?:{atom2}{quant}?|[\^$])*(?:\|(?:{atom2}{quant}?|[\^$])*)*)"
    return alt
_REL_JSON_POINTER = rf"(?:0|[1-9]\d*)(?:#|{_JSON_POINTER})"

FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}T{_TIME}",
    "duration": _DURATION,
    "email": _EMAIL,
    "hostname": _HOSTNAME,
    "idn-hostname": _IDN_HOSTNAME,
    "idn-email": rf"{_ATEXT}+(?:\.{_ATEXT}+)*@{_IDN_HOSTNAME}",
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uuid": _UUID,
    "uri": _URI,
    "uri-reference": _URI_REF,
    "iri": _URI,
    "iri-reference": _URI_REF,
    "uri-template": _URI_TEMPLATE,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": _REL_JSON_POINTER,
}

#: OpenAPI integer formats: value ranges (enforced on integers only)
INT_FORMATS: dict[str, tuple[int, int]] = {
    "int8": (-(2 ** 7), 2 ** 7 - 1),
    "int16": (-(2 ** 15), 2 ** 15 - 1),
    "int32": (-(2 ** 31), 2 ** 31 - 1),
    "int64": (-(2 ** 63), 2 ** 63 - 1),
    "uint8": (0, 2 ** 8 - 1),
    "uint16": (0, 2 ** 16 - 1),
    "uint32": (0, 2 ** 32 - 1),
    "uint64": (0, 2 ** 64 - 1),
}

_MAX_LEN = {"hostname": 253, "email": 254, "idn-hostname": 253, "idn-email": 254}


#: the formats built once per process in a private ExprSet, then imported (a structural copy:
#: the URI regex takes ~100 ms to parse, its import 0.3 ms; a compiler's shared ExprSet is
#: restarted every 20,000 expressions, so without this each restart paid the parse again)
_TEMPLATE_LOCK = threading.Lock()
_TEMPLATE: ExprSet | None = None
_TEMPLATE_EXPRS: dict[str, int | None] = {}


def format_expr(name: str, ex: ExprSet) -> int | None:
    """The decoded-string expression of format ``name`` in ``ex``, or None when the format is
    unknown (built once per process, see ``_TEMPLATE``, and imported into ``ex``)."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        if _TEMPLATE is None:
            _TEMPLATE = ExprSet()
        tpl = _TEMPLATE
        if name not in _TEMPLATE_EXPRS:
            _TEMPLATE_EXPRS[name] = build_format_expr(name, tpl)
        e = _TEMPLATE_EXPRS[name]
    if e is None:
        return None
    memo = ex.__dict__.setdefault("_format_imports", {})
    return ex.import_expr(tpl, e, memo)


def build_format_expr(name: str, ex: ExprSet) -> int | None:
    """:func:`format_expr` built in ``ex`` itself, from the format's regex."""
    src = FORMATS.get(name)
    if src is None and name == "regex":
        src = _regex_subset()
    if src is None:
        return None
    from ..regex import parse_regex

    e = parse_regex(src, ex)
    n = _MAX_LEN.get(name)
    if n is not None:
        if name in ("hostname", "email"):
            # the last label must not be all-numeric (RFC 3696 section 2; the `fqdn` checker
            # enforces it): a label with a letter in it
            label = parse_regex(_LABEL, ex)
            anyb = ex.star(ex.any_byte())
            tld = ex.intersect(label, ex.concat(anyb, parse_regex("[A-Za-z]", ex), anyb))
            e = ex.concat(ex.star(ex.concat(label, ex.literal("."))), tld)
        if name in ("email", "idn-email"):
            # RFC 5321 section 4.5.3.1: a local part of at most 64 octets, a domain (hostname)
            # of at most 253. The 254-octet total of RFC 3696 errata is not enforced: it would
            # make a product automaton of two counters for no practical gain.
            host = e if name == "email" else parse_regex(_IDN_HOSTNAME, ex)
            host = ex.intersect(host, ex.repeat(ex.any_byte(), 1, 253))
            local = parse_regex(rf"{_ATEXT}+(?:\.{_ATEXT}+)*", ex)
            local = ex.intersect(local, ex.repeat(ex.any_byte(), 1, 64))
            return ex.concat(local, ex.literal("@"), host)
        # these formats are ASCII: a byte count is a character count
        e = ex.intersect(e, ex.repeat(ex.any_byte(), 1, n))
    return e
