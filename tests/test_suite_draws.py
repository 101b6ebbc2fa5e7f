"""The suite's Hypothesis tests draw the same examples on every run (the ``ci`` profile of
tests/conftest.py), unless a developer asks for fresh draws with ``--hypothesis-profile explore``."""

from hypothesis import given, settings
from hypothesis import strategies as st


def test_the_default_profile_is_derandomized_without_an_example_database(request):
    if request.config.getoption("hypothesis_profile", None) not in (None, "ci"):
        return  # a developer's exploring run: fresh draws are what was asked for
    assert settings.default.derandomize is True
    assert settings.default.database is None


def test_two_runs_of_one_property_draw_the_same_examples(request):
    if request.config.getoption("hypothesis_profile", None) not in (None, "ci"):
        return

    def draws():
        seen = []

        @settings(max_examples=20)
        @given(st.binary(max_size=64))
        def record(data):
            seen.append(data)

        record()
        return seen

    assert draws() == draws()
