"""OpenAI ``tools`` as structural tags: the tag spec, the system prompt, parsing the calls back.

Tools (``tools=[...]``) become tags ``<tool_call>\\n{"name": "f", "arguments": `` BODY
``}\\n</tool_call>`` (Hermes/Qwen style): :func:`tools_tag_spec` builds the
:class:`~grammask.grammar.structural_tag.TagSpec` (the grammar is
:mod:`grammask.grammar.structural_tag`'s), :func:`tools_system_prompt` tells the model the format,
:func:`parse_tool_calls` turns the generated text back into OpenAI ``tool_calls``.
"""
from __future__ import annotations

import json
import re
import uuid

from ..grammar.structural_tag import TagSpec, TagStructure

__all__ = ["TOOL_END", "TOOL_TRIGGER", "TagSpec", "TagStructure", "new_tool_call_id", "parse_tool_calls",
           "tool_begin", "tools_system_prompt", "tools_tag_spec"]

TOOL_TRIGGER = "<tool_call>"


# ---------------------------------------------------------------------------------------------- tools
def tool_begin(name: str) -> str:
    return TOOL_TRIGGER + '\n{"name": ' + json.dumps(name) + ', "arguments": '


TOOL_END = "}\n</tool_call>"


def tools_tag_spec(tools, tool_choice, parallel_tool_calls: bool | None = None) -> TagSpec:
    """The tag spec of OpenAI ``tools`` (pydantic :class:`~.protocol.Tool` list) and ``tool_choice``."""
    from .protocol import NamedToolChoice

    fns = [t.function for t in tools]
    if isinstance(tool_choice, NamedToolChoice):
        fns = [f for f in fns if f.name == tool_choice.function.name]
        mode, multiple = "required", False
    elif tool_choice == "required":
        mode, multiple = "required", parallel_tool_calls is not False
    else:
        mode, multiple = "auto", True
    structures = tuple(TagStructure(tool_begin(f.name), f.parameters, TOOL_END) for f in fns)
    return TagSpec(structures, (TOOL_TRIGGER,), mode, multiple)


def tools_system_prompt(tools) -> str:
    """Instructions listing the tools, in the format the tags above enforce."""
    lines = ["You can call functions. Available functions (JSON):"]
    for t in tools:
        f = t.function
        lines.append(json.dumps({"name": f.name, "description": f.description or "", "parameters": f.parameters},
                                ensure_ascii=False))
    lines.append('To call a function, answer with <tool_call>\n{"name": <function name>, "arguments": '
                 "<arguments object>}\n</tool_call>")
    return "\n".join(lines)


def parse_tool_calls(text: str, spec: TagSpec) -> tuple[str, list[dict]]:
    """Split generated ``text`` into (text outside the tags, tags): each tag as
    ``{"name", "arguments", "begin"}`` (``name`` for tool tags). A tag cut short (``max_tokens``)
    is dropped from the text when complete tags precede it, else left in the text."""
    calls: list[dict] = []
    outside: list[str] = []
    pos = 0
    dec = json.JSONDecoder()
    triggers = sorted(set(spec.triggers), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(t) for t in triggers))
    partial = False
    while True:
        m = pattern.search(text, pos)
        if m is None:
            break
        begins = [x for x in spec.structures if text.startswith(x.begin, m.start())]
        if not begins:
            partial = True
            break
        s = max(begins, key=lambda x: len(x.begin))
        i = m.start() + len(s.begin)
        while i < len(text) and text[i] in " \t\n\r":
            i += 1
        try:
            body, j = dec.raw_decode(text, i)
        except ValueError:
            partial = True
            break
        k = j
        while k < len(text) and text[k] in " \t\n\r":
            k += 1
        if not text.startswith(s.end, k):
            partial = True
            break
        outside.append(text[pos:m.start()])
        name = None
        if s.begin.startswith(TOOL_TRIGGER) and '"name": ' in s.begin:
            name = json.loads(s.begin[len(TOOL_TRIGGER):] + "null}")["name"]
        calls.append({"name": name, "arguments": body, "begin": s.begin})
        pos = k + len(s.end)
    if partial and calls:
        outside.append(text[pos:m.start()])
    else:
        outside.append(text[pos:])
    return "".join(outside), calls


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
