"""The ``$ref`` registry of one schema document: resources (``$id``), anchors, and resolution."""
from __future__ import annotations

from urllib.parse import unquote, urldefrag, urljoin

from ...errors import InvalidSchemaError, UnsupportedSchemaError

__all__ = ["RefRegistry"]


#: keywords whose values are instance data, never schemas (not indexed)
_DATA_KEYWORDS = frozenset(("enum", "const", "examples", "default", "example"))
#: keywords whose values map names (property names, definition names) to schemas
_NAME_MAPS = frozenset(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                        "dependencies"))

class RefRegistry:
    """Every resource (``$id``) and anchor of the document ``root``, indexed when made; resolves
    ``$ref`` values against them. Nothing remote is fetched."""

    def __init__(self, root, draft: int):
        self.root = root
        self.draft = draft
        self.base0 = "https://grammask.invalid/root.json"
        self.resources: dict[str, tuple] = {}
        self.anchors: dict[str, tuple] = {}
        self.dynamic_anchors: dict[str, set] = {}   # $dynamicAnchor name -> resources declaring it
        self.recursive_anchors: set = set()         # resources with "$recursiveAnchor": true
        #: ``urldefrag`` and ``urljoin`` results (slow in CPython, and a schema repeats the same
        #: few references) of this document: a process-wide memo held thousands of them for
        #: good, which every full collection of a serving process walked
        self._urls: dict = {}
        self._index(root, self.base0, True)

    def _defrag(self, url: str) -> tuple[str, str]:
        """``urldefrag(url)`` as ``(url, fragment)``."""
        r = self._urls.get(url)
        if r is None:
            r = self._urls[url] = tuple(urldefrag(url))
        return r

    def _ref_url(self, base: str, ref: str) -> tuple[str, str, str]:
        """``(full, url, fragment)`` of ``$ref`` ``ref`` read against ``base``."""
        if base is self.base0 and len(ref) > 1 and ref[0] == "#":
            return base + ref, base, ref[1:]   # what urljoin and urldefrag give for this base
        k = (base, ref)
        r = self._urls.get(k)
        if r is None:
            full = urljoin(base, ref)
            r = self._urls[k] = (full, *self._defrag(full))
        return r

    def own_base(self, s: dict, parent: str) -> str:
        sid = s.get("$id") if self.draft > 4 else s.get("id")
        if isinstance(sid, str) and not (sid.startswith("#") and self.draft <= 7):
            return urljoin(parent, sid)
        return parent

    def _index(self, s, parent: str, top: bool = False) -> None:
        """Register resources ($id), anchors ($anchor, $dynamicAnchor, draft 4-7 '#name' ids).
        Each entry is ``(schema, base URI of its parent)``."""
        if isinstance(s, list):
            for x in s:
                self._index(x, parent)
            return
        if not isinstance(s, dict):
            return
        if top or (("$id" if self.draft > 4 else "id") in s or "$anchor" in s or "$dynamicAnchor" in s
                   or "$recursiveAnchor" in s):
            base = self._register(s, parent, top)
        else:
            base = parent   # nothing to register, and the base URI stays
        for k, v in s.items():
            if k in _DATA_KEYWORDS:
                continue
            if k in _NAME_MAPS and isinstance(v, dict):  # names -> schemas: a name is not a keyword
                for sub in v.values():
                    self._index(sub, base)
            elif isinstance(v, (dict, list)):
                self._index(v, base)

    def _register(self, s: dict, parent: str, top: bool) -> str:
        """Register the resource and anchors schema ``s`` declares; its base URI."""
        base = self.own_base(s, parent)
        url, frag = self._defrag(base)
        if top:
            self.resources.setdefault(self._defrag(self.base0)[0], (s, parent))
        if base != parent or top:
            self.resources.setdefault(url, (s, parent))
            if frag and not frag.startswith("/"):
                self.anchors.setdefault(url + "#" + frag, (s, parent))
        sid = s.get("$id") if self.draft > 4 else s.get("id")
        if isinstance(sid, str) and sid.startswith("#") and self.draft <= 7:
            self.anchors.setdefault(url + sid, (s, parent))
        if isinstance(s.get("$dynamicAnchor"), str):
            self.dynamic_anchors.setdefault(s["$dynamicAnchor"], set()).add(url)
        if s.get("$recursiveAnchor") is True:
            self.recursive_anchors.add(url)
        for akw in ("$anchor", "$dynamicAnchor"):
            a = s.get(akw)
            if isinstance(a, str):
                self.anchors.setdefault(url + "#" + a, (s, parent))
        return base

    def resolve(self, ref: str, base: str, pointer: str):
        """``(target, base URI of the target's parent, display name)``."""
        if not isinstance(ref, str):
            raise InvalidSchemaError("$ref must be a string", pointer)
        full, url, frag = self._ref_url(base, ref)
        if not url:
            url = self._defrag(base)[0]
        res = self.resources.get(url)
        if res is None:
            raise UnsupportedSchemaError(f"cannot resolve $ref {ref!r} (remote references are not fetched)",
                                         "$ref", pointer)
        doc, parent = res
        if not frag or frag.startswith("/"):
            target, tparent = doc, parent
            for raw in (frag.split("/")[1:] if frag else []):
                part = unquote(raw).replace("~1", "/").replace("~0", "~")
                here = self.own_base(target, tparent) if isinstance(target, dict) else tparent
                if isinstance(target, dict) and part in target:
                    target = target[part]
                elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                    target = target[int(part)]
                else:
                    raise InvalidSchemaError(f"$ref {ref!r} points to nothing", pointer)
                tparent = here
            return target, tparent, "#" + frag if doc is self.root else full
        hit = self.anchors.get(url + "#" + frag)
        if hit is None:
            raise InvalidSchemaError(f"$ref {ref!r}: anchor not found", pointer)
        return hit[0], hit[1], full

    def dynamic_override(self, kw: str, ref, base: str, pointer: str) -> str | None:
        """Why ``$dynamicRef``/``$recursiveRef`` may resolve, through the dynamic scope, to
        another schema than its static target (None: it cannot, static resolution is exact).
        The dynamic scope can only reach a resource of this document that declares the same
        anchor; when the static target does not declare it (no bookend), the keyword is a
        plain ``$ref``."""
        if not isinstance(ref, str):
            return None
        target, _, _ = self.resolve(ref, base, pointer)
        if not isinstance(target, dict):
            return None
        if kw == "$dynamicRef":
            frag = self._ref_url(base, ref)[2]
            if not frag or frag.startswith("/") or target.get("$dynamicAnchor") != frag:
                return None
            if len(self.dynamic_anchors.get(frag, ())) > 1:
                return f"several resources declare $dynamicAnchor {frag!r}: the dynamic scope decides which applies"
            return None
        if target.get("$recursiveAnchor") is not True or len(self.recursive_anchors) <= 1:
            return None
        return "several resources declare $recursiveAnchor: the dynamic scope decides which applies"
