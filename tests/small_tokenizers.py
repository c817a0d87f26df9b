"""Small tokenizers trained inside the tests with `tokenizers` (no download, a fraction of a second).

``bytelevel_tokenizer()``  GPT-2 style byte-level BPE (ByteLevel pre-tokenizer and decoder), ~400 ids,
                           stop token ``<|endoftext|>`` (id 0).
``spm_tokenizer()``        Llama-2 style byte-fallback BPE: Metaspace pre-tokenizer, decoders
                           Replace("▁", " ") + ByteFallback + Fuse, special ``<unk> <s> </s>`` at
                           ids 0..2 and the 256 ``<0xNN>`` byte tokens at ids 3..258 in the model's
                           vocabulary (as sentencepiece conversions have them), ~500 ids.

Both are trained on the same deterministic corpus: JSON documents (compact and indented, with and
without ``ensure_ascii``) and plain text, with accented letters, CJK and emoji.
"""
from __future__ import annotations

import functools
import json
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

WORDS = ["hello", "world", "naïve", "café", "日本語", "😀", "🚀 launch", "key", "value", "true",
         "null", "Grüße", "ok", "a", "ab", "abc", "x+1", "(2*3)"]


def corpus(seed: int = 0, n: int = 300) -> list[str]:
    r = random.Random(seed)
    lines = []
    for _ in range(n):
        doc = {r.choice(WORDS): [r.randint(-100, 1000), round(r.random(), 3), r.choice(WORDS), None, True,
                                 {"k": r.choice(WORDS)}]}
        lines.append(json.dumps(doc, ensure_ascii=r.random() < 0.3, indent=r.choice([None, 2])))
        lines.append(" ".join(r.choice(WORDS) for _ in range(8)))
    return lines


@functools.lru_cache(maxsize=None)
def bytelevel_tokenizer(vocab_size: int = 400) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    return tok


@functools.lru_cache(maxsize=None)
def spm_tokenizer(n_learned: int = 250) -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tr = trainers.BpeTrainer(vocab_size=n_learned, special_tokens=["<unk>", "<s>", "</s>"],
                             initial_alphabet=list("abcdefghijklmnopqrstuvwxyz{}[]\":,0123456789▁"),
                             show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    # put the 256 byte-fallback pieces into the model's vocabulary right after the specials
    cfg = json.loads(tok.to_str())
    old = cfg["model"]["vocab"]
    pieces = sorted(old, key=old.get)
    vocab: dict[str, int] = {}
    for p in pieces[:3]:
        vocab[p] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for p in pieces[3:]:
        vocab[p] = len(vocab)
    cfg["model"]["vocab"] = vocab
    for a in cfg["added_tokens"]:
        a["id"] = vocab[a["content"]]
    return Tokenizer.from_str(json.dumps(cfg))
