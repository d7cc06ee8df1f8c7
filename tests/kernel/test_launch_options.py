"""Each launcher option is declared once (kernel/launcher/options.py): every front end is built from that list."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from functools import partial

import pytest
from IPython.core.magic_arguments import MagicArgumentParser

import ddp_helpers
from ddp_helpers import InvalidLaunchArguments
from ddp_helpers.kernel.launcher.config import LaunchConfig
from ddp_helpers.kernel.launcher.options import (
    LIVE_OPTIONS,
    OPTIONS,
    LaunchOptions,
    add_flags,
    check_int,
    check_seconds,
    given_options,
    option,
    options_doc,
    options_of,
    parse_env_item,
    parse_show_ranks,
    rank_list,
    with_options,
)
from ddp_helpers.kernel.launcher.runner import launch
from ddp_helpers.kernel.live import live_magics
from ddp_helpers.kernel.live.ranks import start_ranks

NAMES = {option.name for option in OPTIONS}
LIVE_NAMES = {option.name for option in LIVE_OPTIONS}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings if s.startswith("--")}


def _doc(documented: object) -> str:
    assert documented.__doc__, f"{documented} has no docstring"
    return documented.__doc__


def _documented(doc: str) -> set[str]:
    return {name for name in NAMES if f"\n        {name} (default " in doc}


def test_every_declared_option_reaches_every_front_end():
    assert len(NAMES) == len(OPTIONS)  # one declaration per name
    params = inspect.signature(launch).parameters
    assert set(params) - {"script", "script_args"} == NAMES
    assert all(params[o.name].default == o.default for o in OPTIONS)
    assert _documented(_doc(launch)) == NAMES and "{options}" not in _doc(launch)
    config_fields = {f.name: f for f in dataclasses.fields(LaunchConfig) if f.init}
    assert set(config_fields) - {"script", "script_args"} == NAMES
    for declared in OPTIONS:
        f = config_fields[declared.name]
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        assert default == declared.default, declared.name
    # live ranks: the options that make sense for ranks kept between cells (one node, no restarts)
    assert LIVE_NAMES == {"nproc", "backend", "timeout", "startup_timeout", "run_dir", "env", "show_ranks"}
    assert set(inspect.signature(start_ranks).parameters) == LIVE_NAMES
    assert _documented(_doc(start_ranks)) == LIVE_NAMES
    live_flags = {"--" + o.name.replace("_", "-") for o in LIVE_OPTIONS}
    # and the cell-only flags: which ranks run the cell, and the name that holds the ranks
    assert _flags(live_magics.PARSER) == live_flags | {"--rank", "--name"}


def test_adding_an_option_is_one_declaration():
    @dataclasses.dataclass(kw_only=True, frozen=True)
    class WithKnob(LaunchOptions):
        demo_knob: int = option(3, "a knob only this test has", partial(check_int, minimum=0), int, live=True)

    options = options_of(WithKnob)
    knob = options[-1]
    assert options[:-1] == OPTIONS and knob.name == "demo_knob" and knob.annotation == "int"

    assert "demo_knob (default 3): a knob only this test has." in options_doc(options)

    @with_options(options, positional=("nproc",), defaults={"demo_knob": 4})
    def front_end(*args, **kwargs):
        """A front end.

        {options}
        """

    assert inspect.signature(front_end).parameters["demo_knob"].default == 4
    assert "demo_knob (default 4)" in _doc(front_end)

    parser = argparse.ArgumentParser()
    add_flags(parser, options)
    assert given_options(parser.parse_args(["--demo-knob", "5"]), options) == {"demo_knob": 5}
    with pytest.raises(InvalidLaunchArguments, match="demo_knob must be >= 0"):
        knob.check("demo_knob", -1)

    # the dataclass's own fields carry the default, and a mutable default is not shared
    assert WithKnob().demo_knob == 3 and WithKnob().env is not WithKnob().env


def test_one_check_of_seconds_and_one_parser_of_rank_lists():
    assert check_seconds("timeout", 2, allow_none=True) == 2.0
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(
            InvalidLaunchArguments, match="timeout must be a positive number of seconds or None"
        ):
            check_seconds("timeout", bad, allow_none=True)
    assert rank_list("0, 2,") == [0, 2]
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated rank numbers"):
        rank_list("0,x")
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated ranks"):
        parse_show_ranks("0,x")


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((), {"timeout": -1}, "timeout must be a positive number of seconds or None"),
        ((), {"startup_timeout": None}, "startup_timeout must be a positive number of seconds, got None"),
        ((0,), {}, "nproc must be >= 1"),
        ((2,), {"backend": "gloo", "show_ranks": [5]}, r"show_ranks \[5\] is outside this world of 2"),
        ((2,), {"env": {"A": 1}}, "env keys and values must be strings"),
    ],
)
def test_start_ranks_refuses_bad_options_before_anything_starts(tmp_path, args, kwargs, message):
    with pytest.raises(InvalidLaunchArguments, match=message):
        start_ranks(*args, run_dir=tmp_path / "never", **kwargs)
    assert not (tmp_path / "never").exists()
    with pytest.raises(TypeError, match="max_restarts"):  # not a live option: refused as Python would
        start_ranks(2, max_restarts=1)


def test_a_choice_and_an_env_flag_are_checked(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hi')\n")
    with pytest.raises(InvalidLaunchArguments, match="launcher must be one of torchrun, python"):
        launch(script, launcher="mpirun")
    assert parse_env_item("GREETING=hi=there") == ("GREETING", "hi=there")
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        parse_env_item("NO_EQUALS")


def test_the_ranks_magic_takes_the_live_options_as_flags():
    parser = live_magics.PARSER
    assert isinstance(parser, MagicArgumentParser), type(parser)
    opts = parser.parse_argstring("start --nproc 2 --env A=1 --env B=2 --show-ranks 0")
    assert given_options(opts, LIVE_OPTIONS) == {"nproc": 2, "env": {"A": "1", "B": "2"}, "show_ranks": [0]}
    assert ddp_helpers.start_ranks is start_ranks
