"""Long-context retrieval tasks (passkey, needle-in-a-haystack, variable tracking), generated in
process from a seed, answered through the packed cache, scored by exact match."""

from .answer import answer
from .haystack import HAYSTACKS
from .plot import plot_retrieval
from .report import write_retrieval_report
from .run import DEFAULT_DEPTHS, RetrievalSettings, evaluate_retrieval
from .samples import Sample, SampleKey, make_sample
from .scoring import is_correct
from .summary import format_retrieval_table, summarize, wilson
from .tasks import TASKS

__all__ = [
    "DEFAULT_DEPTHS",
    "HAYSTACKS",
    "TASKS",
    "RetrievalSettings",
    "Sample",
    "SampleKey",
    "answer",
    "evaluate_retrieval",
    "format_retrieval_table",
    "is_correct",
    "make_sample",
    "plot_retrieval",
    "summarize",
    "wilson",
    "write_retrieval_report",
]
