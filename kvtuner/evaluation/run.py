"""`run_eval()`: what one `kvtuner eval` does, without printing. The rows are checked against the
model's config before any weights load; then the task runs: perplexity over windows (with
``kl``, KL vs fp on the same windows), perplexity per context length, or a retrieval task. Each
report is formatted as its text table and written where asked. :func:`evaluate` is the
keyword-only front door (``kvtuner.evaluate``) over :class:`~.settings.EvalSettings`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .compare import EvalReport, evaluate_configs, stderr_line
from .configs import EvalConfig, requested_configs
from .settings import EvalSettings

__all__ = ["EvalOutcome", "EvalResult", "EvalSettings", "evaluate", "run_eval"]

Log = Callable[[str], None]


@dataclass(frozen=True)
class EvalResult:
    """One report (an :class:`EvalReport`, or a retrieval task's report dict), its text table
    and the files written from it, in the order they were written."""

    report: EvalReport | dict[str, Any]
    table: str
    written: tuple[Path, ...] = ()


@dataclass(frozen=True)
class EvalOutcome:
    """``results``: one per context length for long-context perplexity, else one."""

    settings: EvalSettings
    results: tuple[EvalResult, ...]

    @property
    def reports(self) -> list[EvalReport | dict[str, Any]]:
        return [r.report for r in self.results]

    @property
    def written(self) -> list[Path]:
        return [path for r in self.results for path in r.written]


def _prepare(settings: EvalSettings, loaded: tuple[Any, Any] | None) -> tuple[Any, Any, list]:
    """(model, tokenizer, configs): placement, rows and the plot dependency checked first, so a
    bad row or a missing CUDA device fails before the weights load."""
    from ..models import load_model, model_fingerprint
    from ..placement import placement
    from ..profile import ModelFingerprint

    s = settings
    where = placement(s.device, s.dtype)
    if loaded is None:
        fingerprint = model_fingerprint(s.model)
    else:
        fingerprint = ModelFingerprint.from_config(loaded[0].config)
    configs = requested_configs(s.profiles, s.uniform, s.hf_quanto, fingerprint)
    if s.plot is not None:
        from .plot import pyplot

        pyplot()  # one line naming the viz extra, before hours of measuring
    model, tokenizer = loaded or load_model(s.model, device=where.device, dtype=where.dtype)
    return model, tokenizer, configs


def _per_length(path: Path | None, n: int, many: bool) -> Path | None:
    """``out.json`` -> ``out-8192.json`` when several lengths each write one."""
    if path is None or not many:
        return path
    return path.with_name(f"{path.stem}-{n}{path.suffix}")


def _perplexity(
    settings: EvalSettings,
    loaded: tuple[Any, Any],
    configs: list[EvalConfig],
    log: Log,
    length: int | None = None,
) -> EvalResult:
    """One perplexity report: whole windows of ``seq_len`` (``length`` None), or windows of
    ``length`` tokens scoring their last ``score_tokens`` (outputs suffixed ``-length`` when
    several lengths each write one)."""
    from .data import load_eval_windows
    from .plot import plot_report
    from .report import format_table, write_report

    s, (model, tokenizer) = settings, loaded
    seq_len = s.seq_len if length is None else length
    windows = load_eval_windows(
        tokenizer, dataset=s.dataset, num_windows=s.num_windows, seq_len=seq_len
    )
    score_last = None if length is None else s.score_tokens
    report = evaluate_configs(
        model,
        windows,
        configs,
        model_name=s.model,
        decode=s.decode,
        log=log,
        score_last=score_last,
    )
    if s.kl:
        from .divergence import add_divergence

        add_divergence(report, model, windows, configs)
    many = length is not None and len(s.context_lengths) > 1
    written = []
    if s.output is not None:
        written.append(write_report(report, _per_length(s.output, seq_len, many)))
    if s.plot is not None:
        written.append(plot_report(report, _per_length(s.plot, seq_len, many)))
    return EvalResult(report, format_table(report), tuple(written))


def _retrieval(
    settings: EvalSettings, loaded: tuple[Any, Any], configs: list[EvalConfig], progress: bool
) -> EvalResult:
    """Answer and score the task's samples (resuming ``results``); HF quanto rows are left out
    (its cache has no residual window to decode with)."""
    from .retrieval import (
        evaluate_retrieval,
        format_retrieval_table,
        plot_retrieval,
        write_retrieval_report,
    )

    s, (model, tokenizer) = settings, loaded
    configs = [c for c in configs if c.kind != "hf-quanto"]
    report = evaluate_retrieval(
        model,
        tokenizer,
        configs,
        s.retrieval,
        model_name=s.model,
        results_path=s.results,
        progress=progress,
    )
    written = []
    if s.output is not None:
        written.append(write_retrieval_report(report, s.output))
    if s.plot is not None:
        written += plot_retrieval(report, s.plot)
    return EvalResult(report, format_retrieval_table(report, s.task), tuple(written))


def run_eval(
    settings: EvalSettings,
    *,
    log: Log = stderr_line,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
) -> EvalOutcome:
    """Evaluate fp and every requested row of ``settings`` on one model and write the outputs.
    log: the per-row progress lines (default stderr); progress: retrieval's bar. loaded: an
    already loaded ``(model, tokenizer)`` used as is; ``settings.model`` then only names it."""
    s = settings
    if s.threads is not None:
        import torch

        torch.set_num_threads(max(1, s.threads))
    model, tokenizer, configs = _prepare(s, loaded)
    pair = (model, tokenizer)
    if s.retrieval is not None:
        results = [_retrieval(s, pair, configs, progress)]
    elif s.context_lengths:
        results = [_perplexity(s, pair, configs, log, n) for n in s.context_lengths]
    else:
        results = [_perplexity(s, pair, configs, log)]
    return EvalOutcome(s, tuple(results))


def evaluate(
    *,
    log: Log = stderr_line,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
    **settings: Any,
) -> EvalOutcome:
    """:func:`run_eval` over ``EvalSettings(**settings)`` (keywords: model, profiles, uniform,
    hf_quanto, task, num_windows, seq_len, context_lengths, kl, decode_speed, output, plot, ...;
    see :class:`EvalSettings`). ``outcome.results[0].table`` is the table `kvtuner eval` prints."""
    return run_eval(EvalSettings(**settings), log=log, progress=progress, loaded=loaded)
