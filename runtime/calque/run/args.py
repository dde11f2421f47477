"""The local entrypoint's command-line arguments, parsed from its signature the way ``modal run`` does.

Each parameter is an option ``--name value`` (underscores written as dashes, as Modal does; the
underscore spelling is accepted too); its type comes from the annotation, else from the default,
else ``str``: ``str``, ``int``, ``float``, ``bool`` (a ``--name/--no-name`` flag) and ``datetime``.
A parameter without a default is required. A ``*args`` parameter takes the remaining words as they
are.
"""

from __future__ import annotations

import datetime
import inspect
import typing
from collections.abc import Callable
from typing import Any

import click

from calque.errors import UsageError

_TYPES: dict[Any, Any] = {str: click.STRING, int: click.INT, float: click.FLOAT, bool: click.BOOL}
_NAMES = {"str": str, "int": int, "float": float, "bool": bool, "datetime": datetime.datetime}


def _annotation(fn: Callable[..., Any], param: inspect.Parameter) -> Any:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation naming something the script never imported
        hints = {}
    ann = hints.get(param.name, param.annotation)
    if isinstance(ann, str):
        ann = _NAMES.get(ann, ann)
    if ann is inspect.Parameter.empty:
        return type(param.default) if param.default not in (inspect.Parameter.empty, None) else str
    return ann


def _option(fn: Callable[..., Any], param: inspect.Parameter) -> click.Parameter:
    ann = _annotation(fn, param)
    dashed, plain = param.name.replace("_", "-"), param.name
    names = [f"--{dashed}"] + ([f"--{plain}"] if plain != dashed else [])
    required = param.default is inspect.Parameter.empty
    # click (8.3) reads an explicit default=None as a default: a required option must get none at all
    extra: dict[str, Any] = {"required": True} if required else {"default": param.default, "show_default": True}
    if ann is bool:
        flags = [f"--{dashed}/--no-{dashed}"]
        return click.Option([*flags, param.name], default=bool(param.default is True), show_default=True)
    if ann is datetime.datetime:
        return click.Option([*names, param.name], type=click.DateTime(), **extra)
    if ann not in _TYPES:
        raise UsageError(
            f"entrypoint {fn.__name__}: parameter {param.name} has type {getattr(ann, '__name__', ann)}; "
            "modal run (and calque run) take str, int, float, bool and datetime.datetime"
        )
    return click.Option([*names, param.name], type=_TYPES[ann], **extra)


def entrypoint_command(fn: Callable[..., Any]) -> click.Command:
    """A click command whose callback returns the keyword arguments for ``fn``."""
    params: list[click.Parameter] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            params.append(click.Argument([param.name], nargs=-1, type=click.UNPROCESSED))
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        else:
            params.append(_option(fn, param))
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
