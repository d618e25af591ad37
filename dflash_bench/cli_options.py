"""A command's options made from declared fields (options.Flag): the command names the model whose options go
where, and receives the values given on the command line, read into the model's field names.

    @app.command()
    @declared_options
    def sweep(settings: Given = Options(SweepSettings), out: Path = typer.Option(...), ...) -> None:
        ...  # settings: {"concurrency": [1, 8], ...}, only what was given

Every Flag becomes a typer option in the model's field order at the marker's place, with the Flag's names, help,
range and visibility; not given is None, so a resumed sweep tells what was given again from what it keeps.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, Callable, Optional, TypeVar, Union

import typer
from pydantic import BaseModel

from dflash_bench.errors import UserError
from dflash_bench.options import Flag, flags

Given = dict[str, Any]  # a model's values given on the command line, by field name
F = TypeVar("F", bound=Callable[..., Any])


class _Declared:
    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model


def Options(model: type[BaseModel]) -> Any:  # noqa: N802 - a parameter's default, as typer.Option is
    """A command parameter's default that stands for every declared option of `model`."""
    return _Declared(model)


def declared_options(func: F) -> F:
    """`func` with each `Options(model)` parameter replaced by the model's declared options; called with the
    values given for them, by field name, in that parameter."""
    hints = typing.get_type_hints(func)
    params: list[inspect.Parameter] = []
    groups: dict[str, type[BaseModel]] = {}
    for p in inspect.signature(func).parameters.values():
        if isinstance(p.default, _Declared):
            groups[p.name] = p.default.model
            params += [_parameter(p.default.model, field, flag) for field, flag in flags(p.default.model)]
        else:
            params.append(p.replace(annotation=hints.get(p.name, p.annotation)))

    def command(**kwargs: Any) -> Any:
        for group, model in groups.items():
            raw = {flag.param: kwargs.pop(flag.param) for _, flag in flags(model)}
            kwargs[group] = given(model, raw)
        return func(**kwargs)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(command, attr, getattr(func, attr))
    return command  # type: ignore[return-value]


def _parameter(model: type[BaseModel], field: str, flag: Flag) -> inspect.Parameter:
    kind = flag.text if flag.text is not None else _plain(model.model_fields[field].annotation)
    option = typer.Option(None, *flag.names, help=flag.help, min=flag.min, max=flag.max, hidden=flag.hidden)
    return inspect.Parameter(flag.param, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option,
                             annotation=Optional[kind])


def _plain(annotation: Any) -> Any:
    """int | None -> int: the type the command line reads for a field that may be unset."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def given(model: type[BaseModel], raw: dict[str, Any]) -> Given:
    """The values the command line gave (by parameter name, None or empty where not given), read into `model`'s
    field names (two flags that fill one dict, as --drafter and --eagle3 do, fill it together); a flag given with
    the one it is another spelling of (Flag.excludes) is refused in one sentence."""
    out: Given = {}
    seen: dict[str, Flag] = {}
    for field, flag in flags(model):
        value = raw.get(flag.param)
        if value is None or (isinstance(value, (list, tuple)) and not value):
            continue
        if flag.excludes in seen:
            raise UserError(f"give {seen[flag.excludes].shown} or {flag.shown}, not both")
        seen[flag.names[0]] = flag
        for name, new in flag.values(field, list(value) if isinstance(value, tuple) else value).items():
            old = out.get(name)
            out[name] = {**old, **new} if isinstance(old, dict) and isinstance(new, dict) else new
    return out
