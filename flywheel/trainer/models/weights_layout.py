"""Weights layouts: how a module reads parameters of the same shapes that can mean different things.

A module with a choice of layout (the Llama's RoPE: `llama/rope.py`) says so with four attributes: `layout_key`
(its name in a checkpoint: a class attribute), `layouts` (those it can run), `legacy_layout` (what a checkpoint
without the key holds) and `layout` (the one it runs). A checkpoint records the model's layouts beside its tensors
(`checkpoint/state.py`: the state's `LAYOUTS_KEY` entry); a restore sets them back, so a run resumes in the layout
its weights were trained in; Hugging Face import and export reorder the tensors whose layout differs from theirs
(`hf_weights.py`, `hf_export.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, cast

from torch import nn

LAYOUTS_KEY = "layouts"  # the checkpoint state's entry: {layout_key: layout}


class HasWeightsLayout(Protocol):
    layout_key: str
    layouts: tuple[str, ...]
    legacy_layout: str
    layout: str


def _layout_modules(model: nn.Module) -> Iterator[HasWeightsLayout]:
    # By the class attribute: a runtime Protocol check took ~6 ms over an 8B Llama's 421 modules, on every save.
    for module in model.modules():
        if isinstance(getattr(type(module), "layout_key", None), str):
            yield cast(HasWeightsLayout, module)


def layouts_of(model: nn.Module) -> dict[str, str]:
    """{layout_key: layout} of the model's modules (empty for a model without a choice of layout)."""
    found: dict[str, str] = {}
    for module in _layout_modules(model):
        if found.setdefault(module.layout_key, module.layout) != module.layout:
            raise ValueError(f"the model's modules disagree on their {module.layout_key} layout")
    return found


def set_layouts(model: nn.Module, layouts: Mapping[str, str]) -> None:
    """Every layout module runs the layout `layouts` names for its key, its legacy layout when the key is absent
    (a checkpoint written before that module had a choice)."""
    for module in _layout_modules(model):
        layout = layouts.get(module.layout_key, module.legacy_layout)
        if layout not in module.layouts:
            raise ValueError(f"the weights' {module.layout_key} layout is {layout!r}, which this version of "
                             f"Flywheel does not run (it runs {', '.join(module.layouts)}); use the version "
                             "that wrote them")
        module.layout = layout
