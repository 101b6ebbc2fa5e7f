"""The facts of each option of a run live in one place, its :class:`PretrainConfig` field's
metadata: its group (``--help`` shows the options in those groups), whether ``--resume`` may
change it (``RESUME_MAY_CHANGE`` is made from it) and whether the Lightning module applies it;
docs/pretrain.md's option table is made from them and must match."""

import argparse
import inspect
import os
import re
from dataclasses import fields

import pytest

from contrastkit.commands import pretrain as command
from contrastkit.methods import RESUME_MAY_CHANGE, PretrainConfig
from contrastkit.methods.config import LIGHTNING_APPLIES, OPTION_GROUPS, option_facts

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _parser():
    parser = argparse.ArgumentParser(prog="contrastkit pretrain")
    command.add_arguments(parser)
    return parser


def test_every_field_has_a_group_and_an_option_in_that_group_of_the_help():
    facts = option_facts()
    assert list(facts) == [f.name for f in fields(PretrainConfig)]
    assert all(fact["group"] in OPTION_GROUPS for fact in facts.values())
    grouped = {}
    for group in _parser()._action_groups:
        for action in group._group_actions:
            grouped[command._field_of(action.dest)] = group.title
    for name, fact in facts.items():
        assert grouped.get(name) == f"{fact['group']} options", name
    titles = [group.title for group in _parser()._action_groups if group._group_actions]
    assert titles[-6:] == [f"{name} options" for name in OPTION_GROUPS] + ["command options"]


def test_what_resume_may_change_is_made_from_the_metadata():
    assert RESUME_MAY_CHANGE == {name for name, fact in option_facts().items() if fact["resume"]}
    # What the trainer's resume check and the studies' run options rely on.
    assert {"epochs", "workers", "threads", "device", "out", "compile"} <= RESUME_MAY_CHANGE
    assert not {"method", "temperature", "batch_size", "precision", "seed", "data"} & RESUME_MAY_CHANGE


def test_a_field_without_its_facts_is_caught():
    """A field added without ``_option`` (no group) fails the first test: planted here."""
    from dataclasses import dataclass, field

    @dataclass
    class Planted(PretrainConfig):
        planted: int = field(default=0)

    missing = [f.name for f in fields(Planted) if "group" not in f.metadata]
    assert missing == ["planted"]


def test_the_lightning_module_documents_exactly_the_fields_it_applies():
    pytest.importorskip("lightning", reason="lightning is not installed (pip install 'contrastkit[lightning]')")
    from contrastkit.integrations.lightning import ContrastiveModule

    doc = inspect.getdoc(ContrastiveModule)
    applies = re.sub(r"\([^)]*\)", "", doc[doc.index("What applies here:"):doc.index("The trainer decides")])
    named = {name for name in option_facts() if f"``{name}``" in applies}
    assert named == set(LIGHTNING_APPLIES)


def test_the_docs_option_table_is_the_one_the_options_make():
    with open(os.path.join(ROOT, "docs", "pretrain.md"), encoding="utf-8") as handle:
        text = handle.read()
    start = text.index("\n", text.index("<!-- the option table:")) + 1
    end = text.index("<!-- end of the option table -->")
    assert text[start:end] == command.option_table(), \
        "docs/pretrain.md's option table is stale: regenerate it from contrastkit.commands.pretrain.option_table()"
