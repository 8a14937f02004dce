"""The manual (docs/, built by MkDocs) keeps up with the code: every command is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuwatch.cli import COMMANDS

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_is_in_the_manual(command):
    # sqlite-utils' habit: a command nobody can find in the manual is a command nobody uses.
    pages = {page.name: page.read_text() for page in DOCS.glob("*.md")}
    shown = [name for name, text in pages.items() if re.search(rf"gpuwatch {re.escape(command)}\b", text)]
    assert shown, f"`gpuwatch {command}` is on no page of docs/"


def test_every_picture_the_manual_shows_exists():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page.name} shows {target}, which is missing"
