"""On-disk cache of the per-tokenizer artefacts: the token trie and the slice forest.

Both are built once per tokenizer (for Llama-3: trie ~0.2 s, slice forest ~0.6-0.9 s), are pure
functions of the vocabulary, and are flat numpy arrays, so a restarted process loads them from
``<cache folder>/tokenizers-v1/<kind>-<key>.npz`` in milliseconds instead of rebuilding them.

The cache folder is :func:`grammask.paths.cache_root` (``$GRAMMASK_CACHE_DIR``, else
``$XDG_CACHE_HOME/grammask``, else ``~/.cache/grammask``). It is on by default; off with
``GRAMMASK_DISK_CACHE=0`` (also ``false``/``no``/``off``) or per tokenizer with
``TokenizerInfo(..., disk_cache=False)``; ``disk_cache=<folder>`` uses that folder as the cache
root, ``disk_cache=True`` turns it on whatever the environment says.

The key is a sha256 over everything an artefact depends on: the tokenizer's
:attr:`~.tokenizer_info.TokenizerInfo.cache_key` (token byte strings in id order, vocab size,
special and stop ids), the artefact's kind and format constant (:data:`TRIE_FORMAT`,
:data:`FOREST_FORMAT`), the slice patterns (forest), the grammask version and a fingerprint of
the sources that build the artefacts (:data:`SOURCE_MODULES`): an edit of the trie or slicer code
makes new keys, never a stale load. A changed vocabulary (one token more, one byte different)
changes the key too.

Robustness: files are written to a temporary name in the same folder and renamed over the target
(``os.replace``), so readers never see a partial file and concurrent writers of the same key (who
write identical content) just replace one another. A file that cannot be read, is truncated or
corrupt (the zip CRC of every array is checked), or whose arrays are inconsistent is ignored: the
artefact is rebuilt and the file overwritten. A folder that cannot be created or written (read
only, full disk) only means the artefact is not cached. None of this raises; failures are logged
at DEBUG level (``grammask.grammar.tokenizer_cache``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from ..paths import cache_root
from .toktrie import TokTrie

log = logging.getLogger(__name__)

#: format of the files this module writes (bump on any change of the layout below)
FORMAT = 1
#: sub-folder of the cache root holding the artefacts
SUBDIR = f"tokenizers-v{FORMAT}"
#: format constants of the artefacts (part of their keys)
TRIE_FORMAT = "toktrie-1"
FOREST_FORMAT = "slice-forest-1"
BPE_CANON_FORMAT = "bpe-canon-1"
CANON_REGIONS_FORMAT = "canon-regions-1"
#: the modules whose code decides what the artefacts hold (their text is part of every key)
SOURCE_MODULES = ("toktrie.py", "slicer.py", "regex.py", "regexset.py", "tokenizer_cache.py")
#: and those whose code decides the canonical side's region verdicts (their artefact only)
CANON_SOURCE_MODULES = ("canonical.py", "canonical_split.py")
#: environment switch: "0", "false", "no" or "off" disables the disk cache
ENV_SWITCH = "GRAMMASK_DISK_CACHE"
_OFF = ("0", "false", "no", "off")

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- where, keys
def cache_folder(setting=None) -> Path | None:
    """The folder of the artefact files for a ``disk_cache`` setting, or None when caching is off.

    ``None``: on unless ``$GRAMMASK_DISK_CACHE`` is off, under :func:`~grammask.paths.cache_root`;
    ``False``: off; ``True``: on; a path: on, with that path as the cache root."""
    if setting is False:
        return None
    if setting is None or setting is True:
        if setting is None and os.environ.get(ENV_SWITCH, "").strip().lower() in _OFF:
            return None
        return cache_root() / SUBDIR
    return cache_root(setting) / SUBDIR


@functools.lru_cache(maxsize=8)
def source_fingerprint(folder: Path | None = None, modules: tuple[str, ...] = SOURCE_MODULES) -> str:
    """sha256 over the text of ``modules`` (default :data:`SOURCE_MODULES`) in ``folder`` (default:
    this package's folder; a file that cannot be read counts as empty). Read once per process."""
    here = Path(__file__).resolve().parent if folder is None else Path(folder)
    h = hashlib.sha256()
    for name in modules:
        try:
            data = (here / name).read_bytes()
        except OSError:
            data = b""
        h.update(name.encode() + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def _grammask_version() -> str:
    try:
        from .. import __version__

        return str(__version__)
    except ImportError:  # pragma: no cover - only while the package itself is being imported
        return "?"


def parts_digest(parts) -> str:
    """Hex sha256 of a sequence of strings, each length-prefixed (no two sequences collide)."""
    h = hashlib.sha256()
    for part in parts:
        b = part.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def artefact_key(tokenizer_info, kind: str, fmt: str, extra: str = "") -> str:
    """Hex sha256 key of one artefact of ``tokenizer_info`` (see the module docstring)."""
    return parts_digest((f"grammask-tokenizer-cache-{FORMAT}", kind, fmt, _grammask_version(), source_fingerprint(),
                         extra, tokenizer_info.cache_key))


def artefact_file(tokenizer_info, kind: str, fmt: str, extra: str = "", setting=None) -> tuple[Path, str] | None:
    """``(file, key)`` of an artefact: ``<cache folder>/<kind>-<key>.npz`` (None: caching is off, or
    ``tokenizer_info`` is not a :class:`~.tokenizer_info.TokenizerInfo` with a ``cache_key``)."""
    folder = cache_folder(setting)
    if folder is None or not isinstance(getattr(tokenizer_info, "cache_key", None), str):
        return None
    key = artefact_key(tokenizer_info, kind, fmt, extra)
    return folder / f"{kind}-{key}.npz", key


# ---------------------------------------------------------------------------------------------- files
def read_arrays(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """The arrays of ``path`` if it is a readable, intact file written for ``key``; else None."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}  # reads (and CRC-checks) every member
        meta = json.loads(str(arrays.pop("__meta__")))
        if meta.get("format") != FORMAT or meta.get("key") != key:
            raise ValueError(f"written for another key or format: {meta}")
        return arrays
    except FileNotFoundError:
        return None
    except Exception as e:  # corrupt, truncated, unreadable: rebuild
        log.debug("tokenizer cache: ignoring %s (%s: %s)", path, type(e).__name__, e)
        return None


def write_arrays(path: Path, key: str, arrays: dict[str, np.ndarray]) -> bool:
    """Write ``arrays`` to ``path`` atomically; False (and nothing left behind) when that fails."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name no other writer uses; mode 0o644 less the umask, like any file the user writes
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, __meta__=np.array(json.dumps({"format": FORMAT, "key": key})), **arrays)
        os.replace(tmp, path)
        return True
    except Exception as e:  # read-only folder, full disk, ...: just not cached
        log.debug("tokenizer cache: cannot write %s (%s: %s)", path, type(e).__name__, e)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def load_or_build(where: tuple[Path, str] | None, build: Callable[[], T],
                  to_arrays: Callable[[T], dict[str, np.ndarray] | None],
                  from_arrays: Callable[[dict[str, np.ndarray]], T]) -> T:
    """The artefact loaded from ``where`` (:func:`artefact_file`), else built with ``build`` and saved
    there (``where`` None: just built)."""
    if where is None:
        return build()
    path, key = where
    arrays = read_arrays(path, key)
    if arrays is not None:
        try:
            return from_arrays(arrays)
        except Exception as e:  # inconsistent arrays: rebuild and overwrite
            log.debug("tokenizer cache: rejecting %s (%s: %s)", path, type(e).__name__, e)
    obj = build()
    try:
        out = to_arrays(obj)
    except Exception as e:  # pragma: no cover - a serialisation bug must not break the caller
        log.debug("tokenizer cache: cannot serialise for %s (%s: %s)", path, type(e).__name__, e)
        out = None
    if out is not None:
        write_arrays(path, key, out)
    return obj


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


# ---------------------------------------------------------------------------------------------- the trie
def check_trie_arrays(trie: TokTrie, vocab_size: int) -> None:
    """Raise ValueError unless the trie's arrays index only inside themselves and the vocabulary."""
    n = trie.n_nodes
    k = trie.n_tokens
    idx = np.arange(n)
    d = trie.node_depth.astype(np.int64)
    _check(d[0] == 0 and bool(np.all(d[1:] >= 1)) and bool(np.all(d[1:] <= d[:-1] + 1)), "node depths")
    _check(bool(np.all(trie.node_end > idx)) and bool(np.all(trie.node_end <= n)) and trie.node_end[0] == n,
           "subtree ends")
    ts, te = trie.node_tok_start, trie.node_tok_end
    _check(bool(np.all(ts >= 0)) and bool(np.all(te >= ts)) and bool(np.all(te <= k)), "token ranges")
    _check(k == 0 or (int(trie.tok_ids.min()) >= 0 and int(trie.tok_ids.max()) < vocab_size), "token ids")


def trie_to_arrays(trie: TokTrie) -> dict[str, np.ndarray]:
    return trie.to_arrays()


def trie_from_arrays(arrays: dict[str, np.ndarray], tokenizer_info) -> TokTrie:
    trie = TokTrie.from_arrays(arrays, token_bytes=tokenizer_info.token_bytes)
    check_trie_arrays(trie, tokenizer_info.vocab_size)
    return trie


def cached_trie(tokenizer_info) -> TokTrie:
    """:class:`TokTrie` of the tokenizer's non-special tokens, from the disk cache when there."""
    setting = getattr(tokenizer_info, "disk_cache", None)
    where = artefact_file(tokenizer_info, "trie", TRIE_FORMAT, setting=setting)
    return load_or_build(where, lambda: TokTrie.build(tokenizer_info.token_bytes), trie_to_arrays,
                         lambda a: trie_from_arrays(a, tokenizer_info))


# ---------------------------------------------------------------------------------------------- the forest
#: the attributes of a :class:`~.slicer.SliceForest` this module knows how to store; a forest with
#: other attributes (the class changed) is not cached (and ``tests/test_tokenizer_cache.py`` fails)
FOREST_ATTRS = frozenset({"patterns", "slice_words", "slice_sizes", "combo_words", "trie", "node_tok",
                          "dup_first", "dup_other", "seg_start", "seg_end", "arrays"})
_FOREST_ARRAYS = ("combo_words", "node_tok", "dup_first", "dup_other", "seg_start", "seg_end")
#: the fields of :data:`~.slicer.ForestArrays` (what the mask kernel reads) this module rebuilds
_FOREST_FIELDS = ("node_byte", "node_depth", "node_end", "node_tok", "seg_start", "seg_end", "combo_words",
                  "dup_first", "dup_other")


def forest_to_arrays(forest) -> dict[str, np.ndarray] | None:
    """The arrays that make up ``forest`` (None when it has attributes this module does not know)."""
    from .slicer import ForestArrays

    if set(vars(forest)) != FOREST_ATTRS or ForestArrays._fields != _FOREST_FIELDS:
        log.debug("tokenizer cache: SliceForest has attributes %s; not cached", sorted(vars(forest)))
        return None
    out = {name: getattr(forest, name) for name in _FOREST_ARRAYS}
    out["slice_sizes"] = np.asarray(forest.slice_sizes, dtype=np.int64)
    out["patterns"] = np.array(json.dumps(list(forest.patterns)))
    out.update({f"trie_{k}": v for k, v in forest.trie.to_arrays().items()})
    return out


def forest_from_arrays(arrays: dict[str, np.ndarray], tokenizer_info, patterns):
    """A :class:`~.slicer.SliceForest` from :func:`forest_to_arrays`'s arrays, checked for consistency
    with the tokenizer (ValueError otherwise): the mask kernel indexes with them unchecked."""
    from .kstruct import kstruct
    from .slicer import ForestArrays, SliceForest

    _check(ForestArrays._fields == _FOREST_FIELDS, "forest layout")
    _check(json.loads(str(arrays["patterns"])) == list(patterns), "patterns")
    trie = TokTrie.from_arrays({k[5:]: v for k, v in arrays.items() if k.startswith("trie_")})
    V = tokenizer_info.vocab_size
    check_trie_arrays(trie, V)
    a = {name: np.ascontiguousarray(arrays[name]) for name in _FOREST_ARRAYS}
    n_slices = len(patterns)
    n = trie.n_nodes
    node_tok = a["node_tok"].astype(np.int32, copy=False)
    _check(node_tok.shape == (n,) and int(node_tok.min(initial=-1)) >= -1 and int(node_tok.max(initial=-1)) < V
           and int(np.count_nonzero(node_tok >= 0)) <= trie.n_tokens, "node tokens")
    combo = a["combo_words"].astype(np.uint32, copy=False)
    _check(combo.shape == (1 << n_slices, (V + 31) // 32), "combo words")
    ss, se = a["seg_start"].astype(np.int32, copy=False), a["seg_end"].astype(np.int32, copy=False)
    _check(ss.shape == se.shape == (n_slices,) and bool(np.all(ss >= 1)) and bool(np.all(se >= ss))
           and bool(np.all(se <= n)), "segments")
    df, do = a["dup_first"].astype(np.int32, copy=False), a["dup_other"].astype(np.int32, copy=False)
    _check(df.shape == do.shape and df.ndim == 1 and (len(df) == 0 or (
        int(min(df.min(), do.min())) >= 0 and int(max(df.max(), do.max())) < V)), "shared-bytes tokens")
    sizes = arrays["slice_sizes"]
    _check(sizes.shape == (n_slices + 1,), "slice sizes")

    f = SliceForest.__new__(SliceForest)
    f.patterns = tuple(patterns)
    f.slice_words = [combo[1 << k].copy() for k in range(n_slices)]
    f.slice_sizes = [int(x) for x in sizes.tolist()]
    f.combo_words = combo
    f.trie = trie
    f.node_tok, f.dup_first, f.dup_other, f.seg_start, f.seg_end = node_tok, df, do, ss, se
    f.arrays = kstruct(ForestArrays(trie.node_byte, trie.node_depth, trie.node_end, node_tok, ss, se, combo, df, do))
    return f


def cached_forest(tokenizer_info, patterns):
    """The tokenizer's :class:`~.slicer.SliceForest` for ``patterns``, from the disk cache when there."""
    from .slicer import SliceForest

    patterns = tuple(patterns)
    setting = getattr(tokenizer_info, "disk_cache", None)
    where = artefact_file(tokenizer_info, "forest", FOREST_FORMAT, json.dumps(list(patterns)), setting)
    return load_or_build(where, lambda: SliceForest(tokenizer_info, patterns), forest_to_arrays,
                         lambda a: forest_from_arrays(a, tokenizer_info, patterns))


# ---------------------------------------------------------------------------------------------- canonical BPE
def cached_bpe_canon(tokenizer_info, spec):
    """The merge-level canonicity structure (:class:`~.canonical_bpe.BpeCanon`) of the tokenizer's
    merge rules ``spec.rules``, from the disk cache when there (keyed by a hash of the rules too)."""
    from .canonical_bpe import BpeCanon

    rules = np.ascontiguousarray(spec.rules, dtype="<i8")
    extra = hashlib.sha256(rules.tobytes()).hexdigest()
    setting = getattr(tokenizer_info, "disk_cache", None)
    where = artefact_file(tokenizer_info, "bpecanon", BPE_CANON_FORMAT, extra, setting)
    return load_or_build(where, lambda: BpeCanon.build(tokenizer_info.token_bytes, rules),
                         lambda b: b.to_arrays(), lambda a: BpeCanon(a, tokenizer_info.vocab_size))


def cached_region_verdicts(tokenizer_info, parts, build: Callable[[], dict[str, np.ndarray]]):
    """The canonical side's verdicts of its common pre-token regions
    (:meth:`~.canonical.CanonicalTokenizer._base_regions`), from the disk cache when there.
    ``parts`` (strings): what besides the tokenizer and the judging code
    (:data:`CANON_SOURCE_MODULES`) decides them: the split pattern, the signatures, the regions."""
    extra = parts_digest((source_fingerprint(None, CANON_SOURCE_MODULES), *parts))
    setting = getattr(tokenizer_info, "disk_cache", None)
    where = artefact_file(tokenizer_info, "canonregions", CANON_REGIONS_FORMAT, extra, setting)
    return load_or_build(where, build, lambda a: a, lambda a: a)


__all__ = [
    "BPE_CANON_FORMAT",
    "CANON_REGIONS_FORMAT",
    "CANON_SOURCE_MODULES",
    "ENV_SWITCH",
    "FOREST_FORMAT",
    "FORMAT",
    "TRIE_FORMAT",
    "artefact_key",
    "artefact_file",
    "cache_folder",
    "cached_bpe_canon",
    "cached_region_verdicts",
    "cached_forest",
    "cached_trie",
    "forest_from_arrays",
    "forest_to_arrays",
    "load_or_build",
]
