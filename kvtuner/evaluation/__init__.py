"""Evaluation: profiles and uniform baselines against fp, measured in the same run.

- perplexity (``perplexity``: K/V quantized before any query reads them) over windows of a test
  text (``data``; WikiText-2 test is embedded), with measured KV bytes (``compare``: one row per
  config) and a table, JSON and PNG of the report (``report``, ``plot``);
- divergence from fp: KL, top-1 agreement and the NLL split (``divergence``);
- transformers' quanto cache as a peer (``quanto``), decode speed (``speed``);
- long-context retrieval tasks (``retrieval``);
- what one run asks for and its run: :class:`EvalSettings` (``settings``), :func:`run_eval` and
  the keyword front door :func:`evaluate` (``run``), which `kvtuner eval` and
  ``kvtuner.evaluate`` are.
"""

from .compare import EvalReport, evaluate_configs, hardware
from .configs import DEFAULT_UNIFORM, EvalConfig, parse_uniform, uniform_specs
from .data import EvalWindows, default_dataset, load_eval_windows
from .perplexity import PerplexityResult, perplexity
from .plot import plot_report
from .report import format_markdown, format_table, write_report
from .run import EvalOutcome, EvalResult, evaluate, run_eval
from .settings import EvalSettings
from .speed import DecodeSettings, measure_decode

__all__ = [
    "DEFAULT_UNIFORM",
    "DecodeSettings",
    "EvalConfig",
    "EvalOutcome",
    "EvalReport",
    "EvalResult",
    "EvalSettings",
    "EvalWindows",
    "PerplexityResult",
    "default_dataset",
    "evaluate",
    "evaluate_configs",
    "format_markdown",
    "format_table",
    "hardware",
    "load_eval_windows",
    "measure_decode",
    "parse_uniform",
    "perplexity",
    "plot_report",
    "run_eval",
    "uniform_specs",
    "write_report",
]
