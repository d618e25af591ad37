"""A setting declared once: a pydantic field (its type and default) whose Annotated metadata holds a `Flag`: the
command line's names for it, its help, how the command line's text reads as the value, and its rule.

    concurrency: Annotated[list[int], Flag("--concurrency", "-c", text=str, parse=ints, rule=distinct_positive,
                                           help="Comma-separated concurrencies. Default 1,8,32.")] = [1, 8, 32]

The command's parameters and the values given on it are made from the fields (cli_options.py), the model is
what is stored (store/settings.py SweepSettings, sweep/slurm.py SlurmOptions), and `check_fields` applies
every field's rule.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from pydantic import BaseModel

from dflash_bench.errors import UserError

Rule = Callable[[Any], "str | None"]  # a value -> the sentence refusing it, or None


class Flag:
    """How the command line names, explains, reads and checks one setting.

    `text`: the type the command line reads (None: the field's own, without None); `parse`: that text -> the
    field's value (a UserError for text it cannot read); `fills`: where one flag sets more than its own field,
    the values it sets; `min`/`max`: the range (the command line shows it and refuses outside it; `check_fields`
    refuses it for a value from anywhere else); `rule`: the sentence for a value the setting cannot take;
    `shown`: how sentences name the flag (default: its first name); `excludes`: another flag of the same field
    that this one is a spelling of (--no-thinking, --thinking off), refused together with it; `start`: what a new run takes where the flag
    is not given, for a field the stored settings require (a stored sweep names its suites; a new one starts
    from "all")."""

    def __init__(self, *names: str, help: str, text: Any = None, parse: Callable[[Any], Any] | None = None,
                 fills: Callable[[Any], dict[str, Any]] | None = None, min: float | None = None,
                 max: float | None = None, rule: Rule | None = None, hidden: bool = False,
                 shown: str | None = None, excludes: str | None = None, start: Any = None) -> None:
        self.names, self.help, self.text, self.parse, self.fills = names, help, text, parse, fills
        self.min, self.max, self.rule, self.hidden, self.start = min, max, rule, hidden, start
        self.excludes = excludes
        self.shown = shown or names[0]

    @property
    def param(self) -> str:
        """The command function's parameter name: the first name without its dashes (--num-prompts: num_prompts)."""
        return self.names[0].lstrip("-").replace("-", "_")

    def values(self, field: str, raw: Any) -> dict[str, Any]:
        """What the command line's `raw` sets, by field name."""
        if self.fills is not None:
            return self.fills(raw)
        return {field: self.parse(raw) if self.parse is not None else raw}

    def refusal(self, value: Any) -> str | None:
        """The sentence for a value outside the range or against the rule (None: the value stands)."""
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                if self.min is not None and item < self.min:
                    return f"{self.shown} must be at least {_number(self.min)}, not {_number(item)}"
                if self.max is not None and item > self.max:
                    return f"{self.shown} must be at most {_number(self.max)}, not {_number(item)}"
        return self.rule(value) if self.rule is not None else None

    def __repr__(self) -> str:
        return f"Flag({', '.join(self.names)})"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def flags(model: type[BaseModel]) -> Iterator[tuple[str, Flag]]:
    """(field name, Flag) of every declared option of `model`, in the order of its fields (a field may have two:
    --thinking and --no-thinking)."""
    for name, info in model.model_fields.items():
        for meta in info.metadata:
            if isinstance(meta, Flag):
                yield name, meta


def starts(model: type[BaseModel]) -> dict[str, Any]:
    """What a new run takes for the required fields the command line did not give (Flag.start)."""
    return {name: flag.start for name, flag in flags(model) if flag.start is not None}


def check_fields(model: type[BaseModel], values: dict[str, Any]) -> None:
    """Every declared field's range and rule over `values` (None: not set, nothing to check); the first refusal
    as a UserError."""
    for name, flag in flags(model):
        if values.get(name) is not None and (why := flag.refusal(values[name])):
            raise UserError(why)


def listed(names: list[str]) -> str:
    """["a", "b", "c"] -> "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


# ------------------------------------------------------------------ text the command line reads


def parse_list(value: str | None, kind: Callable[[str], Any] = str) -> list[Any] | None:
    """'1,8,32' -> [1, 8, 32]; None stays None; a bad item is a UserError."""
    if value is None:
        return None
    try:
        return [kind(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"cannot read {value!r} as a comma-separated list of {kind.__name__}s") from None


def names(value: str) -> list[str]:
    """A comma-separated list of names."""
    return parse_list(value) or []


def ints(value: str) -> list[int]:
    """A comma-separated list of integers."""
    return parse_list(value, int) or []
