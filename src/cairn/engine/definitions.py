"""What ``@app.workflow`` and ``@app.step`` record about a function.

Type hints are read once, at decoration time: they drive typed decoding of
inputs and results (so replay hands back the same types the first run saw)
and let bad annotations fail at import rather than mid-run.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from cairn.codec import upcasters, values
from cairn.engine.credentials import SecretParams, wants_value
from cairn.errors import IncompatiblePayload, PayloadError
from cairn.retry import RetryPolicy


def hints_of(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to plain JSON
        return {}


@dataclass(frozen=True, slots=True)
class StepDef:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    retry: RetryPolicy
    result_type: Any
    #: parameters annotated ``SecretValue``: resolved from references just before the body runs
    secrets: SecretParams | None = None

    @classmethod
    def build(cls, fn: Callable[..., Any], name: str | None, retry: RetryPolicy) -> StepDef:
        hints = hints_of(fn)
        result_type = hints.get("return", Any)  # for async def: the awaited type
        values.decoder_for(result_type)  # fail now on an undecodable annotation
        if wants_value(result_type):
            raise TypeError(f"step {name or fn.__qualname__} is annotated to return a SecretValue, which is "
                            "never recorded: return the cairn.Secret reference (or nothing)")
        secrets = SecretParams.of(inspect.signature(fn), hints)
        return cls(name or fn.__name__, fn, inspect.iscoroutinefunction(fn), retry, result_type, secrets)


@dataclass(frozen=True, slots=True)
class WorkflowDef:
    """A registered workflow. Inputs are stored as ``{param: value}``."""

    name: str
    version: str
    fn: Callable[..., Any]
    is_async: bool
    signature: inspect.Signature  # without the leading context parameter
    param_types: dict[str, Any]
    result_type: Any

    @classmethod
    def build(cls, fn: Callable[..., Any], name: str | None, version: str) -> WorkflowDef:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise TypeError(f"workflow {fn.__qualname__} must take the context as its first parameter")
        hints = hints_of(fn)
        rest = params[1:]
        types: dict[str, Any] = {}
        for p in rest:
            annotation = hints.get(p.name, Any)
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                annotation = list[annotation]  # type: ignore[valid-type]
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                annotation = dict[str, annotation]  # type: ignore[valid-type]
            types[p.name] = annotation
        result_type = hints.get("return", Any)
        values.decoder_for(result_type)
        for param, annotation in types.items():
            if wants_value(annotation):
                raise TypeError(f"workflow {fn.__qualname__}: parameter {param!r} is annotated SecretValue; "
                                "a run's input is recorded, so it takes a cairn.Secret reference (annotate "
                                "cairn.Secret) and the steps and tools that use it resolve it")
        return cls(
            name=name or fn.__name__,
            version=version,
            fn=fn,
            is_async=inspect.iscoroutinefunction(fn),
            signature=sig.replace(parameters=rest),
            param_types=types,
            result_type=result_type,
        )

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Map call arguments to ``{param: value}``; ``TypeError`` if they do not fit."""
        bound = self.signature.bind(*args, **kwargs)
        return dict(bound.arguments)

    def inputs_from_json(self, data: Any) -> dict[str, Any]:
        """Inputs given as JSON (the CLI's ``--input``): an object names the
        parameters, an array lists them in order, anything else is the only
        argument. Values are validated against the annotations."""
        if isinstance(data, dict):
            arguments = self.bind((), data)
        elif isinstance(data, list):
            arguments = self.bind(tuple(data), {})
        else:
            arguments = self.bind((data,), {})
        return self.convert(arguments)

    def convert(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Turn plain JSON values into the annotated types (validating them)."""
        out: dict[str, Any] = {}
        for name, value in arguments.items():
            type_ = self.param_types.get(name, Any)
            if upcasters.versioned_in(type_):  # an input recorded by older code reads through the upcasters
                out[name] = values.decode(values.encode(value), type_,
                                          what=f"input {name!r} of workflow {self.name!r}")
                continue
            try:
                out[name] = msgspec.convert(value, type_, dec_hook=values.dec_hook)
            except (msgspec.ValidationError, NotImplementedError, ValueError) as exc:
                raise PayloadError(f"input {name!r} of workflow {self.name!r}: {exc}") from None
        return out

    def recorded(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """``convert`` of a run's recorded input, which was validated when the
        run started: if it no longer fits, the code's types changed since, a
        deployable fix (an upcaster), so ``IncompatiblePayload`` (the run is
        parked ``incompatible``), never the run's failure."""
        try:
            return self.convert(arguments)
        except PayloadError as exc:
            named = [getattr(t, "__qualname__", repr(t)) for t in self.param_types.values()]
            raise IncompatiblePayload(named[0] if len(named) == 1 else f"input of {self.name}", None, None,
                                      str(exc), None) from None

    def call_args(self, arguments: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments for calling the function."""
        bound = inspect.BoundArguments(self.signature, arguments)  # type: ignore[arg-type,unused-ignore]
        return bound.args, bound.kwargs
