"""``grammask chat``: argument handling and output, on the scripted backend."""
from __future__ import annotations

import json

import pytest

from grammask import cli
from grammask.adapters import models
from grammask.pipeline import AsyncEngine
from grammask.pipeline.scripted import ScriptedBackend

PERSON = '{"name": "Alice", "age": 42}'


@pytest.fixture
def scripted(monkeypatch):
    seen = {}

    async def fake_create_engine(model=None, device="auto", **kw):
        seen.update(model=model, device=device)
        return AsyncEngine(ScriptedBackend(PERSON))

    monkeypatch.setattr(models, "create_engine", fake_create_engine)
    return seen


def test_chat_json_schema(scripted, tmp_path, capsys):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                                   "age": {"type": "integer"}}}))
    assert cli.main(["chat", "--schema", str(schema), "--device", "cpu", "who?"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[0]) == {"name": "Alice", "age": 42}
    assert out[1].startswith("usage: prompt ") and "grammar init" in out[1]
    assert scripted == {"model": None, "device": "cpu"}


def test_chat_grammar_json_stream_and_plain(scripted, tmp_path, capsys):
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "{\\"name\\": \\"" [A-Za-z]+ "\\", \\"age\\": " [0-9]+ "}"')
    assert cli.main(["chat", "--grammar", str(g), "x"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == PERSON
    assert cli.main(["chat", "--json", "--stream", "x"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == PERSON
    assert cli.main(["chat", "x", "--max-tokens", "3"]) == 0
    cap = capsys.readouterr()
    assert "incomplete" in cap.err and cap.out.splitlines()[1].startswith("usage:")


def test_chat_errors(scripted, tmp_path, capsys):
    g = tmp_path / "bad.gbnf"
    g.write_text("root ::= (")
    assert cli.main(["chat", "--grammar", str(g), "x"]) == 2
    assert "error" in capsys.readouterr().err
    assert cli.main(["chat", "--schema", str(tmp_path / "missing.json"), "x"]) == 2
    with pytest.raises(SystemExit):
        cli.main(["chat", "--json", "--regex", "a", "x"])


def test_chat_canonical_flag_reaches_the_request(scripted, capsys):
    """``--canonical`` asks for canonical matchers: the scripted vocabulary is not a BPE, so the
    request is refused with the typed error's reason (not silently plain)."""
    assert cli.main(["chat", "--json", "x"]) == 0
    capsys.readouterr()
    assert cli.main(["chat", "--json", "--canonical", "x"]) == 2
    assert "canonical" in capsys.readouterr().err.lower()
