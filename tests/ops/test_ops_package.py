"""The kernel layer's package: `gtopk_hvd.ops` names every public function of its modules in
`__all__` (the host-read counter, tests/helpers/host_syncs.py, watches exactly those), and
each name there is the module's own object."""

from __future__ import annotations

import inspect
import pkgutil

from gtopk_hvd import ops


def test_all_names_every_public_function_of_the_package() -> None:
    public = {}
    for info in pkgutil.iter_modules(ops.__path__):
        module = __import__(f"gtopk_hvd.ops.{info.name}", fromlist=["_"])
        for name, value in vars(module).items():
            if (not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
                    and value.__module__ == module.__name__):
                public[name] = value
    assert "take_at" in public and "accumulate_threshold" in public
    assert sorted(set(public) - set(ops.__all__)) == []
    for name, value in public.items():
        assert getattr(ops, name) is value, name
    assert all(hasattr(ops, name) for name in ops.__all__)
