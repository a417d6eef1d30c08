"""fly-modules: FlyPrompt's analytic router and temporal-ensemble head as drop-in PyTorch modules.

The core imports nothing but torch (and numpy where noted), so it drops into codebases that pin old
torch/timm versions. Method-specific retrofits live in :mod:`fly_modules.adapters`.
"""

from ._validation import InvalidParameterError as InvalidParameterError
from ._validation import NotFittedError as NotFittedError
from .classifier import ClassifierNotFoundError as ClassifierNotFoundError
from .classifier import find_classifier as find_classifier
from .classifier import locate_classifier as locate_classifier
from .ensemble import AGGREGATION_RULES as AGGREGATION_RULES
from .ensemble import TemporalEnsembleHead as TemporalEnsembleHead
from .ensemble import aggregate_logits as aggregate_logits
from .masks import batch_seen_class_mask as batch_seen_class_mask
from .masks import class_mask as class_mask
from .masks import seen_class_mask as seen_class_mask
from .router import AnalyticRouter as AnalyticRouter
from .router import RandomExpansion as RandomExpansion
from .router import RouterConditioningWarning as RouterConditioningWarning
from .router import RouterSolveError as RouterSolveError
from .schedule import SampleBudgetSchedule as SampleBudgetSchedule
from .schedule import SessionSchedule as SessionSchedule

__version__ = "0.1.0"

__all__ = [
    "AGGREGATION_RULES",
    "AnalyticRouter",
    "ClassifierNotFoundError",
    "InvalidParameterError",
    "NotFittedError",
    "RandomExpansion",
    "RouterConditioningWarning",
    "RouterSolveError",
    "SampleBudgetSchedule",
    "SessionSchedule",
    "TemporalEnsembleHead",
    "aggregate_logits",
    "batch_seen_class_mask",
    "class_mask",
    "find_classifier",
    "locate_classifier",
    "seen_class_mask",
]
