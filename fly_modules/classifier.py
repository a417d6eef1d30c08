"""Where a model's classifier is: :func:`locate_classifier` finds it (timm's ``get_classifier()``, else the
child ``head``, else ``fc``), :func:`find_classifier` the ``nn.Linear`` that :class:`TemporalEnsembleHead`
wraps."""

from __future__ import annotations

from typing import Tuple

from torch import nn

from ._validation import InvalidParameterError

__all__ = ["ClassifierNotFoundError", "find_classifier", "locate_classifier"]


class ClassifierNotFoundError(LookupError, TypeError):
    """A module has no classifier where :func:`locate_classifier` looks.

    Also a ``TypeError``: the module given is not of a kind that has a classifier.
    """


def locate_classifier(module: nn.Module) -> Tuple[str, nn.Module]:
    """``(name, classifier)`` of ``module``'s classifier: what ``get_classifier()`` (timm) returns, else
    the child ``head``, else ``fc``.

    ``name`` is the attribute path from ``module`` (``"head"``; dotted when ``get_classifier()``
    returns a grandchild, e.g. ``"head.fc"``), so ``module.get_submodule(name)`` is the classifier.
    Raises :class:`ClassifierNotFoundError` naming ``module``'s children when there is none.

    Examples::

        >>> model = nn.Module()
        >>> model.head = nn.Linear(8, 3)
        >>> locate_classifier(model)
        ('head', Linear(in_features=8, out_features=3, bias=True))
    """
    getter = getattr(module, "get_classifier", None)
    classifier = getter() if callable(getter) else None
    if isinstance(classifier, nn.Module):
        for name, child in module.named_modules():
            if child is classifier and name:
                return name, child
    for name in ("head", "fc"):
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return name, child
    children = [f"{name} ({type(child).__name__})" for name, child in module.named_children()]
    raise ClassifierNotFoundError(
        f"{type(module).__name__} has no classifier: no get_classifier() submodule, `head` or `fc` "
        f"(its children are {children or 'none'})"
    )


def find_classifier(module: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` classifier of ``module``: itself, or the one :func:`locate_classifier` finds."""
    if isinstance(module, nn.Linear):
        return module
    try:
        name, classifier = locate_classifier(module)
    except ClassifierNotFoundError as error:
        raise ClassifierNotFoundError(f"TemporalEnsembleHead needs an nn.Linear classifier; {error}") from None
    if not isinstance(classifier, nn.Linear):
        raise InvalidParameterError(
            f"TemporalEnsembleHead needs an nn.Linear classifier; {type(module).__name__}'s classifier `{name}` is "
            f"{type(classifier).__name__}. Pass the nn.Linear itself (timm models built with num_classes=0 have no "
            f"classifier: build them with num_classes=C or pass a fresh nn.Linear)."
        )
    return classifier
