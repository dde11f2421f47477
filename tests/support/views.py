"""What holds a pydantic-free view (``calque.models.view_reader``) to the model it mirrors."""

from __future__ import annotations

import dataclasses


def assert_same_fields_and_defaults(view: type, model: type) -> None:
    """``view`` has exactly ``model``'s fields; each required in both, or with the same default."""
    fields = {f.name: f for f in dataclasses.fields(view)}
    assert set(fields) == set(model.model_fields)
    for name, info in model.model_fields.items():
        f = fields[name]
        if info.is_required():
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, name
        else:
            ours = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert ours == info.get_default(call_default_factory=True), name
