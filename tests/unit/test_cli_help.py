"""``facefuse --help`` reads as plain text and lists every exit code the errors use."""

from __future__ import annotations

import argparse
import re

import facefuse.errors as errors
from facefuse.cli import EPILOG, build_parser


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand's parser, depth first."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += all_parsers(sub)
    return found


def test_help_texts_have_no_restructured_text_markup() -> None:
    parsers = all_parsers(build_parser())
    assert len(parsers) >= 9  # facefuse, models + its 4, samples, analyse, fuse, serve
    for parser in parsers:
        text = parser.format_help()
        assert not re.search(r"``|:(mod|class|func|data|meth):`", text), parser.prog


def test_epilog_documents_every_exit_code_of_the_errors() -> None:
    codes = {cls.exit_code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.FacefuseError)}
    listed = {int(m) for m in re.findall(r"^  (\d+)  ", EPILOG, re.M)}
    assert codes - {1} <= listed, sorted(codes - listed)
    assert listed == set(range(0, 8)) | {130}  # (130: interrupted, by convention)
    assert EPILOG in build_parser().format_help()


def test_readme_exit_code_table_is_the_help_epilog() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = dict(re.findall(r"^\| (\d) \| (.+?) \|$", readme, re.M))
    epilog = dict(re.findall(r"^  (\d)  (.+)$", EPILOG, re.M))
    assert {k: v.replace("`", "") for k, v in table.items()} == epilog
