"""Fingerprint of grammask's masks over a MaskBench sample, to compare two versions bit for bit.

    python benchmarks/mask_fingerprint.py DATA_DIR OUT.jsonl [--every 20] [--max-schemas K]
    python benchmarks/mask_fingerprint.py --compare A.jsonl B.jsonl

For every schema of the sample (every N-th line of ``DATA_DIR/*.jsonl``, as benchmarks/maskbench.py
picks them) compile once on one shared ``GrammarCompiler`` (as the benchmark does), then for each
test instance (``json.dumps(data)`` tokenized with Llama-3) compute the mask before each token and
commit the token when the mask allows it (and the matcher accepts it). One line per schema: the
compile error if any, and per instance the number of tokens accepted, ``can_terminate`` at the
end, the error raised while masking if any, and one sha256 over all its masks. Nothing is timed:
the output depends only on the code, so two versions compare line by line.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Llama3  # noqa: E402
from maskbench import load_schemas  # noqa: E402


def fingerprint(data_dir: Path, out_path: Path, every: int, max_schemas: int | None) -> None:
    import numpy as np

    from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo, allocate_token_bitmask

    tok = Llama3()
    info = TokenizerInfo.from_huggingface(tok.path)
    compiler = GrammarCompiler(info, cache_size=0)
    bitmask = allocate_token_bitmask(1, info.vocab_size)
    schemas = load_schemas(data_dir, every, max_schemas)
    t_all = time.perf_counter()
    with open(out_path, "w") as out:
        for sid, split, schema, tests in schemas:
            t0 = time.perf_counter()
            rec = {"id": sid, "split": split, "compile_error": None, "tests": []}
            try:
                compiled = compiler.compile_json_schema(schema)
            except Exception as e:  # noqa: BLE001 - a refusal is part of the fingerprint
                rec["compile_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                compiled = None
            if compiled is not None:
                for t in tests:
                    tokens = tok.encode(json.dumps(t["data"]))
                    m = GrammarMatcher(compiled)
                    h = hashlib.sha256()
                    n_ok, err, can = 0, None, None
                    try:
                        for x in tokens:
                            m.fill_next_token_bitmask(bitmask, 0)
                            h.update(np.ascontiguousarray(bitmask[0]).tobytes())
                            allowed = (int(bitmask[0, x >> 5]) >> (x & 31)) & 1
                            if not (allowed and m.accept_token(x)):
                                break
                            n_ok += 1
                        can = bool(m.can_terminate())
                    except Exception as e:  # noqa: BLE001
                        err = f"{type(e).__name__}: {str(e)[:200]}"
                    rec["tests"].append({"n_tokens": len(tokens), "accepted": n_ok, "can_terminate": can,
                                         "error": err, "masks_sha256": h.hexdigest()})
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print(f"{sid} {split} {len(rec['tests'])} tests {time.perf_counter() - t0:.2f}s", file=sys.stderr)
    print(f"{len(schemas)} schemas in {time.perf_counter() - t_all:.1f}s", file=sys.stderr)


def compare(a_path: Path, b_path: Path) -> int:
    a = [json.loads(x) for x in open(a_path)]
    b = [json.loads(x) for x in open(b_path)]
    diffs = 0
    if len(a) != len(b):
        print(f"different numbers of schemas: {len(a)} vs {len(b)}")
        diffs += 1
    for ra, rb in zip(a, b):
        if ra != rb:
            diffs += 1
            print(f"DIFF {ra['id']}: {json.dumps(ra)[:300]}\n   vs {json.dumps(rb)[:300]}")
    n_masks = sum(t["accepted"] + 1 for r in a for t in r["tests"])
    print(f"{len(a)} schemas, {sum(len(r['tests']) for r in a)} instances, ~{n_masks} masks: "
          f"{diffs} differences")
    return 1 if diffs else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--max-schemas", type=int, default=None)
    ap.add_argument("--compare", action="store_true")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(Path(args.paths[0]), Path(args.paths[1]))
    fingerprint(Path(args.paths[0]), Path(args.paths[1]), args.every, args.max_schemas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
