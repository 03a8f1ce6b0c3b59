"""Re-export: model loading lives in :mod:`kvtuner.models`, below the runtimes that use it."""

from ..models import *  # noqa: F403  (one list of names: kvtuner.models.__all__)
from ..models import __all__  # noqa: F401
