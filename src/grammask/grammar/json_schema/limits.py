"""Bounds on the work of one JSON Schema compile (beyond them :class:`~grammask.errors.GrammarTooComplexError`).

The bottom of the package's import graph: every stage reads its bounds from here.
"""
from __future__ import annotations

MAX_UNION = 2000            # options of one union (after distributing intersections)
MAX_UNROLL = 10_000         # minItems/maxItems/minProperties... unrolled into rules
MAX_PATTERN_REGIONS = 64    # key regions of patternProperties combinations
MAX_OBJECT_STATES = 100_000
MAX_UNIQUE_VALUES = 10
MAX_UNFOLD_DEPTH = 200
MAX_RULES = 500_000
MAX_NEGATED_REGEXES = 3
MAX_INTERSECTIONS = 200_000  # subschema intersections one compile may compute (bounds its time)
MAX_EMPTY_CHECK_STATES = 2000   # regex emptiness checks while simplifying (unknown beyond)
