"""The action parsing rules: the reference's strict `Action:` line rule and the lenient rule."""
from __future__ import annotations

import random
import string

import pytest

from environments.parsing import (
    EXACT, LENIENT, MULTIPLE_ACTIONS, NONE, STRICT, clean_action, last_named, normalize, parse_reply, strict_line,
    strict_rest,
)

AVAILABLE = ["turn left", "turn right", "move forward", "go to red ball 1", "pickup red ball 1",
             "go to red ball 11"]


def parse(reply: str, mode: str):
    return parse_reply(reply, mode, accepts=lambda a: a in AVAILABLE,
                       lenient_find=lambda r: last_named(r, AVAILABLE))


def test_strict_takes_the_rest_of_the_action_line_cleaned():
    assert strict_line("Thought:\nhmm\n\nAction:\ngo to red ball 1\nmore text") == "go to red ball 1"
    assert strict_line("Action: go to  red-ball 1!") == "go to redball 1"
    assert strict_line("Action:   craft 1 blue dye using 1 lapis lazuli, 2 x") == \
        "craft 1 blue dye using 1 lapis lazuli, 2 x"
    assert strict_line("no marker here") is None
    assert strict_line("Action:\n\n   \n") is None
    assert clean_action("  a\tb  c ;:") == "ab c"  # a tab is dropped, not turned into a space


def test_strict_rest_is_sciworlds_rule():
    assert strict_rest("Thought: x\nAction: focus on  the beaker\n") == "focus on  the beaker"
    assert strict_rest("Action: a\nAction: b") == "b"
    assert strict_rest("nothing") is None


def test_more_than_one_action_marker_is_rejected_in_both_modes():
    reply = "Action:\nturn left\nAction:\nturn right"
    for mode in (STRICT, LENIENT):
        parsed = parse(reply, mode)
        assert not parsed.found and parsed.rule == NONE and parsed.error == MULTIPLE_ACTIONS


def test_strict_needs_the_marker_and_keeps_case():
    assert parse("I will turn left", STRICT).rule == NONE
    parsed = parse("Action: Turn Left", STRICT)
    assert parsed.action == "Turn Left" and parsed.rule == STRICT  # the env decides whether case matters


def test_lenient_takes_the_last_available_action_named_anywhere():
    parsed = parse("Maybe turn right... no: I'll GO TO the red ball? Final: go-to red ball 1!", LENIENT)
    assert parsed.action == "go to red ball 1" and parsed.rule == LENIENT
    assert parse("first go to red ball 1 then turn left", LENIENT).action == "turn left"
    # Whole words only, and the longer name wins where two end at the same place.
    assert parse("go to red ball 11", LENIENT).action == "go to red ball 11"
    assert parse("turn lefty", LENIENT).found is False


def test_lenient_prefers_a_valid_strict_action_and_reports_which_rule_found_it():
    parsed = parse("I could turn right.\nAction:\nturn left", LENIENT)
    assert parsed.action == "turn left" and parsed.rule == STRICT
    parsed = parse("Action: spin around, then move forward", LENIENT)
    assert parsed.action == "move forward" and parsed.rule == LENIENT
    parsed = parse("Action: spin around", LENIENT)  # nothing available named: the env explains the strict one
    assert parsed.action == "spin around" and parsed.rule == STRICT


@pytest.mark.parametrize("mode", [STRICT, LENIENT])
def test_bad_output_never_raises(mode):
    rng = random.Random(7)
    noise = "".join(rng.choice(string.printable + "äöü漢字🙂") for _ in range(10_000))
    for reply in ("", noise, "Action:\n向左转", "\x00\x01", "Action:" * 3):
        parsed = parse(reply, mode)
        assert parsed.found is False and parsed.error, reply[:30]


def test_normalize_drops_case_and_punctuation():
    assert normalize("Go-To: the RED ball #1!") == "go to the red ball 1"


def test_a_reply_that_is_exactly_an_action_is_told_apart_from_prose_naming_one():
    assert parse("go to red ball 1", LENIENT).rule == EXACT
    assert parse("  Go to red ball 1.\n", LENIENT).rule == EXACT  # case, spacing and end punctuation aside
    assert parse("You can choose to turn left at the red ball", LENIENT).rule == LENIENT
    assert parse("Action: go to red ball 1", LENIENT).rule == STRICT
