"""benchmarks/ab_settings.py: the settings it compares are parsed into (owner, attribute, value),
and a malformed or unknown one is refused before anything runs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from ab_settings import parse_setting  # noqa: E402


def test_settings_name_module_attributes_and_values():
    import grammask.grammar.lexer as lexer
    import grammask.grammar.state_cache as state_cache

    got = parse_setting(["grammask.grammar.lexer:EAGER_RESOLVE_BUDGET=2 * 32",
                         "grammask.grammar.state_cache:BUILD_AFTER=1"])
    assert got == [(lexer, "EAGER_RESOLVE_BUDGET", 64), (state_cache, "BUILD_AFTER", 1)]
    assert lexer.EAGER_RESOLVE_BUDGET != 64   # parsing sets nothing


def test_a_class_attribute_is_reached_by_a_dotted_name():
    from grammask.grammar.lexdfa import FastCall

    assert parse_setting(["grammask.grammar.lexdfa:FastCall.check=True"]) == [(FastCall, "check", True)]


@pytest.mark.parametrize("bad", ["grammask.grammar.lexer", "grammask.grammar.lexer:EAGER_RESOLVE_BUDGET",
                                 "grammask.grammar.lexer:NO_SUCH_NAME=1"])
def test_malformed_or_unknown_settings_are_refused(bad):
    with pytest.raises(SystemExit):
        parse_setting([bad])
