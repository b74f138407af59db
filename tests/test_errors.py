"""The one-line messages of errors: what a user reads first names what to fix."""

from __future__ import annotations

from optbuild.common.errors import root_cause


def raised(make) -> BaseException:
    try:
        make()
    except BaseException as exc:  # the test inspects whatever was raised
        return exc
    raise AssertionError("nothing was raised")


def wrapped() -> None:
    try:
        try:
            raise RuntimeError("operator torchvision::nms does not exist\n(more lines)")
        except RuntimeError as inner:
            raise ImportError("torchvision failed") from inner
    except ImportError as exc:
        raise ModuleNotFoundError("Could not import module 'BertModel'") from exc


def test_the_innermost_cause_is_named_through_causes_and_contexts():
    assert root_cause(raised(wrapped)) == "; caused by RuntimeError: operator torchvision::nms does not exist"

    def in_handler() -> None:
        try:
            raise KeyError("weights")
        except KeyError:
            raise ValueError("bad checkpoint")  # an implicit context, as libraries leave

    assert root_cause(raised(in_handler)) == "; caused by KeyError: 'weights'"


def test_an_error_with_no_cause_or_a_suppressed_one_adds_nothing():
    def alone() -> None:
        raise ValueError("plain")

    def suppressed() -> None:
        try:
            raise KeyError("hidden")
        except KeyError:
            raise ValueError("said plainly") from None

    assert root_cause(raised(alone)) == "" and root_cause(raised(suppressed)) == ""
