"""grammask.grammar.utf8.utf8_prefix: complete characters kept, an incomplete tail dropped."""
from __future__ import annotations

import pytest

from grammask.grammar.utf8 import utf8_prefix


@pytest.mark.parametrize("text", ["", "a", "é", "€", "😀", "aé€😀"])
def test_every_cut_keeps_the_whole_characters(text):
    data = text.encode("utf-8")
    for cut in range(len(data) + 1):
        head = utf8_prefix(data[:cut])
        assert data[:cut].startswith(head)
        assert head.decode("utf-8") == data[:cut].decode("utf-8", errors="ignore")


def test_a_lone_invalid_lead_byte_is_left_alone():
    assert utf8_prefix(b"\xff") == b"\xff"
