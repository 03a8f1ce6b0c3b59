"""One list of presets: the CLI help and the docs table are generated from PRESETS and agree."""

from __future__ import annotations

from pathlib import Path

from kvtuner.cli.main import build_parser
from kvtuner.search_spaces import PRESETS
from kvtuner.search_spaces.preset_table import DOCS_BEGIN, DOCS_END, presets_markdown

SEARCH_DOC = Path(__file__).resolve().parents[2] / "docs" / "search.md"


def _preset_help(command: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    (action,) = [a for a in sub._actions if "--preset" in a.option_strings]
    return action.help


def test_docs_table_is_the_generated_one():
    text = SEARCH_DOC.read_text(encoding="utf-8")
    block = text.split(DOCS_BEGIN, 1)[1].split(DOCS_END, 1)[0].strip()
    assert block == presets_markdown(), (
        "docs/search.md's preset table is stale: paste kvtuner.search_spaces.preset_table."
        "presets_markdown() between its markers"
    )
    names = [line.split("`")[1] for line in block.splitlines()[2:]]
    assert names == list(PRESETS)


def test_cli_help_names_every_preset():
    for command in ("search", "calibrate"):
        help_text = _preset_help(command)
        for name in PRESETS:
            assert f" {name}," in help_text or f" {name} (" in help_text, (command, name)
