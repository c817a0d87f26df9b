"""Dead ends of canonical decoding (issue 14): random walks through the canonical mask on a
MaskBench sample (Llama-3), counting walks that reach an empty mask.

    python benchmarks/canonical_dead_ends.py [DATA_DIR] [--every 200] [--walks 4] [--max-len 200]
        [--forced-after-words N] [--forced-after-wide-words N]

Each walk starts a ``GrammarMatcher(compiled, canonical=True)`` on a schema of the sample and takes
tokens from its mask at random (a stop token 30% of the time when allowed, a token of at most two
bytes 30%, else any allowed token, seeded per walk), until the grammar ends, the length limit, or an empty
mask: a *dead end*, a token allowed earlier that no canonical continuation the grammar accepts can
follow. Finished walks are decoded and re-encoded by ``tokenizers`` (the oracle): a walk whose ids
differ is non-canonical. For each dead end the last tokens, the grammar's forced text there and the
size of the plain mask are printed, so the classes of dead ends can be read off.
``--forced-after-words N`` sets :attr:`.CanonicalState.forced_after_words`, the widest mask (in
non-zero words) whose candidates are judged along the text the grammar forces after them (0: none),
``--forced-after-wide-words N`` :attr:`.CanonicalState.forced_after_wide_words` (the widest whose
candidates but whitespace are);
``--narrow`` sets :attr:`.CanonicalState.narrow_lookahead` to True (the one-step lookahead after
every token of whitespace ending in a space or a tab; by default only after whitespace).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_MASKBENCH, command_line, llama3_tokenizer_path  # noqa: E402

import maskbench as mb  # noqa: E402
from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo  # noqa: E402
from grammask.grammar.canonical import CanonicalState, CanonicalTokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DEFAULT_MASKBENCH))
    ap.add_argument("--every", type=int, default=200)
    ap.add_argument("--walks", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--forced-after-words", type=int, default=None)
    ap.add_argument("--forced-after-wide-words", type=int, default=None)
    ap.add_argument("--narrow", action="store_true",
                    help="CanonicalState.narrow_lookahead = True (every whitespace token ending in a space, "
                         "not only after whitespace)")
    a = ap.parse_args()
    if a.forced_after_words is not None:
        CanonicalState.forced_after_words = a.forced_after_words
    if a.forced_after_wide_words is not None:
        CanonicalState.forced_after_wide_words = a.forced_after_wide_words
    if a.narrow:
        CanonicalState.narrow_lookahead = True
    from tokenizers import Tokenizer

    info = TokenizerInfo.from_huggingface(llama3_tokenizer_path())
    tk = Tokenizer.from_file(str(llama3_tokenizer_path()))
    ct = CanonicalTokenizer.from_info(info)
    comp = GrammarCompiler(info)
    V, stop = info.vocab_size, set(info.stop_token_ids)
    tb = info.token_bytes
    walks = done = bad = dead = steps = 0
    deads = []
    t0 = time.time()

    def ids_of(mask):
        return np.nonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:V])[0]

    for sid, _split, schema, _tests in mb.load_schemas(Path(a.data), a.every, None):
        try:
            c = comp.compile_json_schema(schema)
        except Exception:  # noqa: BLE001 - schemas the compiler refuses are not walked
            continue
        for w in range(a.walks):
            # one generator per walk: a mask that changes in one walk leaves the others as they were
            # (runs of two versions compare walk by walk)
            rng = random.Random(f"{a.seed}:{sid}:{w}")
            m = GrammarMatcher(c, canonical=ct)
            ids: list[int] = []
            walks += 1
            for _ in range(a.max_len):
                allowed = ids_of(m.get_next_token_bitmask())
                steps += 1
                if len(allowed) == 0:
                    dead += 1
                    pm = GrammarMatcher(c)
                    for x in ids:
                        pm.accept_token(x)
                    deads.append((sid, [tb[x] for x in ids[-3:]], pm.find_jump_forward_bytes(40),
                                  len(ids_of(pm.get_next_token_bitmask()))))
                    break
                st = [int(x) for x in allowed if x in stop]
                r = rng.random()
                if st and r < 0.3:
                    t = st[0]
                elif r < 0.6:
                    short = [int(x) for x in allowed if len(tb[x]) <= 2]
                    t = rng.choice(short) if short else int(rng.choice(allowed))
                else:
                    t = int(rng.choice(allowed))
                assert m.accept_token(t)
                if t in stop:
                    break
                ids.append(t)
            if m.is_terminated():
                done += 1
                text = info.decode(ids).decode("utf-8", "replace")
                bad += tk.encode(text, add_special_tokens=False).ids != ids
    print(f"`{command_line()}`\n")
    print("| walks | mask steps | finished | non-canonical | dead ends | s |")
    print("| --: | --: | --: | --: | --: | --: |")
    print(f"| {walks} | {steps} | {done} | {bad} | {dead} | {time.time() - t0:.0f} |\n")
    print("dead ends (schema, last tokens, forced text there, plain mask size):")
    for d in deads:
        print(" ", d)


if __name__ == "__main__":
    main()
