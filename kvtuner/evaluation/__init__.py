"""Evaluation: perplexity (DESIGN.md protocol), KV bytes, decode speed; fp in the same run."""

from .compare import EvalReport, evaluate, hardware
from .configs import DEFAULT_UNIFORM, EvalConfig, parse_uniform, uniform_specs
from .data import EvalWindows, default_dataset, load_eval_windows
from .perplexity import PerplexityResult, perplexity
from .plot import plot_report
from .report import format_markdown, format_table, write_report
from .speed import DecodeSettings, measure_decode

__all__ = [
    "DEFAULT_UNIFORM",
    "DecodeSettings",
    "EvalConfig",
    "EvalReport",
    "EvalWindows",
    "PerplexityResult",
    "default_dataset",
    "evaluate",
    "format_markdown",
    "format_table",
    "hardware",
    "load_eval_windows",
    "measure_decode",
    "parse_uniform",
    "perplexity",
    "plot_report",
    "uniform_specs",
    "write_report",
]
