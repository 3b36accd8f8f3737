"""Checks of the options users type, with one message format for all of them:

    gtopk_hvd: <option> must be <what is allowed>, got <type> <value>; <the fix>

A value of the wrong type raises `OptionTypeError`, a value of the right type out of range (or a
combination that means nothing) `OptionError`. `OptionTypeError` is a TypeError and also a
ValueError (what earlier versions raised for every bad option), so code that caught ValueError
still catches it. Nothing here imports the implementations: the configuration
(`gtopk_hvd.compression`), the schemes' own checks (`gtopk_hvd.schemes`) and the adapters'
arguments use these helpers.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any, NoReturn


class OptionError(ValueError):
    """An option's value is out of range, unknown, or meaningless with the other options."""


class OptionTypeError(TypeError, ValueError):
    """An option's value has the wrong type (also a ValueError, as earlier versions raised)."""


def describe(value: Any) -> str:
    """`<type> <repr>` of a value, as the messages print it (e.g. "str '0.01'")."""
    return f"{type(value).__name__} {value!r}"


def one_of(choices: Iterable[Any]) -> str:
    """'one of "a", "b", "c"' for a message's allowed part (a single choice: just it)."""
    shown = [repr(choice) for choice in choices]
    return shown[0] if len(shown) == 1 else f"one of {', '.join(shown)}"


def message(option: str, allowed: str, value: Any, fix: str = "") -> str:
    """The one format (module docstring); `fix` may be empty."""
    text = f"gtopk_hvd: {option} must be {allowed}, got {describe(value)}"
    return f"{text}; {fix}" if fix else text


def refuse(option: str, allowed: str, value: Any, fix: str = "", *,
           wrong_type: bool = False) -> NoReturn:
    """Raises OptionTypeError (wrong_type) or OptionError with `message`."""
    error = OptionTypeError if wrong_type else OptionError
    raise error(message(option, allowed, value, fix))


def is_number(value: Any) -> bool:
    """A real number that is not a bool (Python's or numpy's)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and (
        type(value).__name__ != "bool_")


def is_integer(value: Any) -> bool:
    """An integer that is not a bool (Python's or numpy's)."""
    return isinstance(value, numbers.Integral) and is_number(value)


def check_number(option: str, value: Any, low: float, high: float, *, low_open: bool = False,
                 high_open: bool = False, fix: str = "") -> None:
    """`value` is a number in the interval low..high (open at the ends said so)."""
    interval = (f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
                if high != float("inf") else f"{'>' if low_open else '>='} {low:g}")
    allowed = f"a number in {interval}" if high != float("inf") else f"a number {interval}"
    if not is_number(value):
        refuse(option, allowed, value, fix, wrong_type=True)
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above or value != value:  # NaN is in no interval
        refuse(option, allowed, value, fix)


def check_integer(option: str, value: Any, minimum: int, fix: str = "") -> None:
    """`value` is an integer >= minimum."""
    allowed = f"an integer >= {minimum}"
    if not is_integer(value):
        refuse(option, allowed, value, fix, wrong_type=True)
    if value < minimum:
        refuse(option, allowed, value, fix)


def check_flag(option: str, value: Any, fix: str = "") -> None:
    """`value` is True or False."""
    if not isinstance(value, bool):
        refuse(option, "True or False", value, fix, wrong_type=True)


def check_choice(option: str, value: Any, choices: Iterable[Any], fix: str = "") -> None:
    """`value` is one of `choices` (strings: anything else of another type is a type error)."""
    choices = tuple(choices)
    if value in choices and type(value) in {type(choice) for choice in choices}:
        return
    kinds = {type(choice) for choice in choices}
    refuse(option, one_of(choices), value, fix, wrong_type=type(value) not in kinds)
