"""The local entrypoint's command-line arguments, parsed from its signature the way ``modal run`` does.

Checked against modal-client 1.5.4 (``modal/cli/run.py``: ``_get_cli_runnable_signature``,
``_add_click_options``, ``_get_param_type_as_str``; its tests ``test/cli_test.py``
``test_run_parse_args_*``, ``test_run_literal_*``, ``test_cli_run_variadic_args``):

- each parameter is an option ``--name value``, underscores written as dashes (calque also accepts
  the underscore spelling); a parameter without a default is required;
- its type is the annotation (never the default): ``str``, ``int``, ``float``, ``bool`` (a
  ``--name/--no-name`` flag), ``datetime.datetime``; ``Optional[X]``, ``Union[X, None]`` and
  ``X | None`` read as ``X``; ``Literal[...]`` of strings or of integers is a choice; no annotation
  (or ``Any``) passes the word through as a string. Anything else (an enum, ``list[int]``, a union of
  two types, a ``Literal`` of booleans or mixed types) is refused as ``modal run`` refuses it;
- ``*args`` takes every remaining word as it is, dashes included, and then the entrypoint may have
  no other parameter.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

import click

from calque.errors import UsageError

# modal's option_parsers, keyed as _get_param_type_as_str spells the annotation
_PARSERS: dict[str, Any] = {
    "str": click.STRING,
    "int": click.INT,
    "float": click.FLOAT,
    "bool": click.BOOL,
    "datetime.datetime": click.DateTime(),
    "Any": click.UNPROCESSED,
}
_OPTIONAL = (
    r"typing\.Optional\[([\w.]+)\]",
    r"typing\.Union\[([\w.]+), NoneType\]",
    r"([\w.]+) \| None",
    r"<class '([\w\.]+)'>",
)


class _LiteralInt(click.Choice):  # type: ignore[type-arg]
    """modal's LiteralIntParamType: a choice of integers, given as their digits."""

    def __init__(self, values: tuple[int, ...]) -> None:
        self.ints = {str(v): v for v in values}
        super().__init__(list(self.ints))

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            if value in self.ints.values():
                return value
            value = str(value)
        return self.ints[super().convert(value, param, ctx)]


def _type_string(hint: Any) -> str:
    text = str(hint)
    for pattern in _OPTIONAL:
        m = re.match(pattern, text)
        if m is not None:
            return m.group(1)
    return text


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception as exc:  # an annotation naming something the script never imported
        raise UsageError(f"entrypoint {fn.__name__}: its type hints cannot be evaluated here ({exc})") from None


def _parser(fn: Callable[..., Any], param: inspect.Parameter, hint: Any) -> tuple[Any, bool]:
    """(click type, is a bool flag) for one parameter, or the UsageError modal run's refusal would be."""
    if typing.get_origin(hint) is typing.Literal:
        values = typing.get_args(hint)
        if all(isinstance(v, str) for v in values):
            return click.Choice(list(values)), False
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return _LiteralInt(values), False
    else:
        name = _type_string(hint)
        if name in _PARSERS:
            return _PARSERS[name], name == "bool"
    raise UsageError(
        f"entrypoint {fn.__name__}: parameter {param.name} has an annotation modal run cannot parse "
        f"({param.annotation}); modal run (and calque run) take str, int, float, bool, datetime.datetime, "
        "Optional[...] of those, Literal[...] of strings or of integers, and unannotated parameters (as strings)"
    )


def _option(fn: Callable[..., Any], param: inspect.Parameter, hint: Any) -> click.Parameter:
    parser, flag = _parser(fn, param, hint)
    dashed, plain = param.name.replace("_", "-"), param.name
    names = [f"--{dashed}/--no-{dashed}"] if flag else [f"--{dashed}"] + ([f"--{plain}"] if plain != dashed else [])
    # click (8.3) reads an explicit default=None as a default: a required option must get none at all
    if param.default is inspect.Parameter.empty:
        extra: dict[str, Any] = {"required": True}
    else:
        extra = {"default": param.default, "show_default": True}
    return click.Option([*names, param.name], type=parser, **extra)


def entrypoint_command(fn: Callable[..., Any]) -> click.Command:
    """A click command whose callback returns the keyword arguments for ``fn`` (``*args`` under its name)."""
    sig = inspect.signature(fn)
    variadic = [p for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_POSITIONAL]
    others = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    if variadic:
        if others:
            raise UsageError(
                f"entrypoint {fn.__name__}: a function with *{variadic[0].name} can have no other parameters "
                "(modal run refuses it too)"
            )
        settings = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}
        name = variadic[0].name

        def every_word(ctx: click.Context) -> dict[str, Any]:
            return {name: list(ctx.args)}

        return click.Command(fn.__name__, context_settings=settings, callback=click.pass_context(every_word))
    hints = _hints(fn)
    params = [_option(fn, p, hints.get(p.name, "Any")) for p in others if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return click.Command(fn.__name__, params=params, callback=lambda **kw: kw, help=inspect.getdoc(fn))


def parse_entrypoint_args(fn: Callable[..., Any], args: list[str]) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments for ``fn`` from ``args``; a UsageError says what is wrong."""
    cmd = entrypoint_command(fn)
    try:
        got = cmd.main(args=args, prog_name=f"calque run SCRIPT::{fn.__name__}", standalone_mode=False)
    except click.ClickException as exc:
        raise UsageError(f"entrypoint {fn.__name__}: {exc.format_message()}") from None
    if not isinstance(got, dict):  # --help was asked for and printed: stop here, as click does
        raise click.exceptions.Exit(0)
    kwargs: dict[str, Any] = got
    positional: list[Any] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            positional = list(kwargs.pop(param.name, ()))
    return positional, kwargs
