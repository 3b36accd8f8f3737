"""Horovod's own wrappers, swapped: `hvd.DistributedOptimizer(..., compression=<gtopk_hvd sparse>)`
builds gtopk_hvd's optimizer, so that changing only the `compression=` argument of a Horovod
script is enough.

Explicit behaviour (a monkey-patch of Horovod's modules, done on import of an adapter):

    import gtopk_hvd.torch              horovod.torch.DistributedOptimizer, horovod.torch.join
    import gtopk_hvd.tensorflow         horovod.tensorflow.DistributedGradientTape,
                                        horovod.tensorflow.DistributedOptimizer,
                                        horovod.tensorflow.join
    import gtopk_hvd.tensorflow.keras   horovod.tensorflow.keras.DistributedOptimizer,
                                        horovod.keras.DistributedOptimizer

`hvd.join()` becomes gtopk_hvd's join while a sparse step lives (`gtopk_hvd.core.join`;
Horovod's own otherwise). Each DistributedOptimizer attribute becomes a wrapper
(`functools.wraps`: Horovod's name, docstring and signature stay visible) that looks at
`compression=` only. A gtopk_hvd sparse compression
(`gtopk_hvd.compression.SparseCompression`: `Compression.gtopk(...)`, `.topk(...)`,
`.sparse(...)`) builds gtopk_hvd's wrapper of the same name with the same arguments (matched by
name; gtopk_hvd's own keywords such as `transport=` or `gtopk_state=` may be added). A Horovod
argument that gtopk_hvd's wrapper lacks (the Keras wrapper's `scale_local_gradients`) is accepted
at its default and raises NotImplementedError otherwise. Anything else (no compression,
`hvd.Compression.none` / `.fp16`, any other compressor, arguments Horovod itself refuses) calls
Horovod's original function with the original arguments: its result is unchanged bit for bit.

The wrapper carries `__gtopk_hvd_swap__`, the original function: installing twice (a re-import,
`importlib.reload`) wraps once, and `restore()` puts every original back. Only the adapter's own
Horovod module is patched (importing gtopk_hvd.torch does not import TensorFlow, nor the
reverse); a Horovod module that does not import is skipped quietly.

What the swap cannot reach: a name bound before the adapter was imported, e.g.
`from horovod.torch import DistributedOptimizer` done first, keeps Horovod's original. A sparse
compression handed to it then raises TypeError naming the fix at the first gradient it would
compress (`SparseCompression.compress`), instead of Horovod's AttributeError.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Callable, Iterable
from typing import Any

from gtopk_hvd.compression import SparseCompression

MARKER = "__gtopk_hvd_swap__"
"""Attribute of a swapped function: Horovod's original function."""

_originals: dict[tuple[str, str], Callable[..., Any]] = {}  # (module, attribute) -> original


def install_around(module_name: str, attribute: str,
                   ours: Callable[..., Any]) -> bool:
    """Replaces `module_name.attribute` (a Horovod function) by one that calls
    `ours(original, *args, **kwargs)`: ours decides whether Horovod's original runs (e.g.
    `hvd.join()`, which is ours while a sparse optimizer lives, Horovod's otherwise). Undone by
    `restore` like `install`; idempotent; False when there is no such module or attribute."""
    def around_of(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def around(*args: Any, **kwargs: Any) -> Any:
            return ours(original, *args, **kwargs)

        setattr(around, MARKER, original)
        around.__doc__ = (original.__doc__ or "") + (
            f"\n\n    gtopk_hvd: {ours.__module__}.{ours.__qualname__} decides whether this "
            "runs (gtopk_hvd.horovod_swap).\n")
        return around

    return _replace(module_name, attribute, around_of)


def install(module_name: str, attribute: str, ours: Callable[..., Any]) -> bool:
    """Replaces `module_name.attribute` (a Horovod wrapper) by a swap to `ours` for gtopk_hvd
    sparse compressions (module docstring). Returns whether the attribute is swapped now; False
    when the module does not import or has no such attribute. Idempotent."""
    return _replace(module_name, attribute, lambda original: swapped(original, ours))


def _replace(module_name: str, attribute: str,
             replacement_of: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Sets `module_name.attribute` to replacement_of(original) and records the original for
    `restore`; True if it is replaced now (also when it already was), False when the module does
    not import or has no such attribute."""
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - not importable here (no such framework, broken build)
        return False
    original = getattr(module, attribute, None)
    if original is None:
        return False
    if hasattr(original, MARKER):
        return True
    setattr(module, attribute, replacement_of(original))
    _originals[(module_name, attribute)] = original
    return True


def restore(names: Iterable[str] | None = None) -> list[str]:
    """Puts Horovod's originals back wherever `install` swapped them (and they were not replaced
    since); returns their dotted names. names: only these (e.g.
    "horovod.torch.DistributedOptimizer"); None: all. Re-importing an adapter does not swap
    again (Python caches modules): call `install` for that."""
    wanted = None if names is None else set(names)
    restored = []
    for (module_name, attribute), original in list(_originals.items()):
        if wanted is not None and f"{module_name}.{attribute}" not in wanted:
            continue
        module = sys.modules.get(module_name)
        if module is not None and hasattr(getattr(module, attribute, None), MARKER):
            setattr(module, attribute, original)
            restored.append(f"{module_name}.{attribute}")
        del _originals[(module_name, attribute)]
    return restored


def installed() -> list[str]:
    """The dotted names of the Horovod functions swapped now."""
    return [f"{module_name}.{attribute}" for (module_name, attribute) in _originals
            if hasattr(getattr(sys.modules.get(module_name), attribute, None), MARKER)]


def swapped(original: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    """`original` (Horovod's) that hands calls with a gtopk_hvd sparse compression to `ours`."""
    original_signature = inspect.signature(original)
    ours_signature = inspect.signature(ours)
    ours_name = f"{ours.__module__}.{ours.__qualname__}"

    @functools.wraps(original)
    def swap(*args: Any, **kwargs: Any) -> Any:
        arguments = _arguments_for_ours(original_signature, ours_signature, ours_name, args,
                                        kwargs)
        if arguments is None:
            return original(*args, **kwargs)
        return ours(**arguments)

    setattr(swap, MARKER, original)
    swap.__doc__ = (original.__doc__ or "") + (
        f"\n\n    gtopk_hvd: with a gtopk_hvd sparse compression this builds {ours_name} with "
        "the same arguments instead (gtopk_hvd.horovod_swap).\n")
    return swap


def _arguments_for_ours(original: inspect.Signature, ours: inspect.Signature, ours_name: str,
                        args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The keyword arguments for `ours`, or None when the call is Horovod's (no sparse
    compression, or arguments that do not bind: Horovod then raises its own error)."""
    extra = {name: value for name, value in kwargs.items()
             if name not in original.parameters and name in ours.parameters}
    try:
        bound = original.bind(*args, **{name: value for name, value in kwargs.items()
                                        if name not in extra})
    except TypeError:
        return None
    if not isinstance(bound.arguments.get("compression"), SparseCompression):
        return None
    arguments = dict(extra)
    for name, value in bound.arguments.items():
        if name in ours.parameters:
            arguments[name] = value
        elif not _is_default(value, original.parameters[name].default):
            raise NotImplementedError(
                f"{name}={value!r}: gtopk_hvd's {ours_name}, which Horovod's wrapper builds for "
                f"a gtopk_hvd sparse compression, does not support it (leave it at its default "
                f"{original.parameters[name].default!r})")
    return arguments


def _is_default(value: object, default: object) -> bool:
    if value is default:
        return True
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # noqa: BLE001 - an __eq__ that cannot compare: not the default
        return False
