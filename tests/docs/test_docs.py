"""The docs stay honest: their `kvtuner ...` command lines parse, their relative links resolve, and
the README's HF snippet runs.

Commands are read from fenced code blocks (backslash continuations joined, `&&`/`;`/`|` chains
and `#` comments split off) and from inline code spans. Each must name a real subcommand, and
every `--flag` on it must be one of that subcommand's options (the CLI's own parser, not a
shell). `kvtuner serve` hands every flag to SGLang, so only its name is checked.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "calibration"))
from calib_helpers import save_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
PASS_THROUGH = {"serve"}  # flags belong to `python -m sglang.launch_server`

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")  # inline code may wrap over lines
# `kvtuner SUB` at a word start (also `.venv/bin/kvtuner`, `python -m kvtuner`); log lines such
# as `kvtuner pool: ...` have no subcommand word and are not commands
COMMAND = re.compile(r"(?:^|[\s/])kvtuner ([a-z][a-z-]*)(?=\s|$)(.*)", re.S)
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s[^)]*)?\)")  # [text](target "title"), images too
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
URL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto: ... are not checked


def _page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _code_texts(text: str) -> list[str]:
    """Shell lines of fenced blocks (continuations joined) and inline spans, whitespace-flat."""
    texts = []
    for lang, body in FENCE.findall(text):
        if lang in ("", "bash", "sh"):
            texts += body.replace("\\\n", " ").splitlines()
    texts += SPAN.findall(FENCE.sub("", text))
    return [" ".join(t.split()) for t in texts]


def _commands(text: str) -> list[str]:
    found = []
    for code in _code_texts(text):
        for part in re.split(r"&&|;|\s\|\s|\s#\s", code):  # `local|tpe` is one value
            match = COMMAND.search(part)
            if match:
                found.append(f"kvtuner {match.group(1)}{match.group(2)}".strip())
    return found


def _all_commands() -> list[tuple[str, str]]:
    return [(_page_id(p), c) for p in PAGES for c in _commands(p.read_text(encoding="utf-8"))]


@pytest.fixture(scope="module")
def subcommands() -> dict:
    from kvtuner.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # argparse has no public API
    return sub.choices


def test_the_docs_hold_commands_for_every_stage():
    named = {c.split()[1] for _, c in _all_commands()}
    assert {"search", "calibrate", "eval", "generate", "show", "validate"} <= named


@pytest.mark.parametrize(("page", "command"), _all_commands())
def test_documented_command_exists_with_its_flags(subcommands, page, command):
    name = command.split()[1]
    assert name in subcommands, f"{page}: `{command}`: no subcommand {name!r}"
    if name in PASS_THROUGH:
        return
    known = subcommands[name]._option_string_actions
    unknown = [f for f in FLAG.findall(command) if f not in known]
    assert not unknown, f"{page}: `{command}`: {unknown} not in `kvtuner {name} --help`"


def test_the_checker_catches_a_wrong_flag_and_a_wrong_subcommand(subcommands):
    (bad,) = _commands("```bash\nkvtuner search --model m \\\n  --budgett 4bit\n```")
    assert bad == "kvtuner search --model m --budgett 4bit"
    assert "--budgett" not in subcommands["search"]._option_string_actions
    (typo,) = _commands("run `kvtuner serch --model m` first")
    assert typo.split()[1] not in subcommands
    assert _commands("`kvtuner pool: profile <hash>` and `kvtuner.calibration`") == []


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: a link keeps its text; lowercase; only letters, digits,
    spaces, hyphens and underscores survive; spaces become hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = _slug(heading)
        anchors.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return anchors


def _broken_links(page: Path) -> list[str]:
    """Relative link targets of a Markdown page (code left out) that name no file or no heading."""
    prose = SPAN.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    broken = []
    for target in LINK.findall(prose):
        if URL.match(target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_relative_links_name_a_file_and_a_heading(page):
    assert _broken_links(page) == []


def test_the_link_checker_catches_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Same\n\n## Same\n\n```bash\n# not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#same-1) [self](#local) [web](https://x.org/y.md)\n"
        "[file](c.md) [dup](a.md#same-2) [fenced](a.md#not-a-heading)\n`[code](d.md)`\n\n# Local\n"
    )
    assert _broken_links(tmp_path / "b.md") == [
        "c.md: no such file",
        "a.md#same-2: no heading #same-2 in a.md",
        "a.md#not-a-heading: no heading #not-a-heading in a.md",
    ]
    assert _slug("One scale a token-head (`per-token-head`): quality") == (
        "one-scale-a-token-head-per-token-head-quality"
    )


def _hf_snippets() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [body for lang, body in FENCE.findall(text) if lang == "python" and "apply(" in body]


def test_readme_hf_snippet_runs_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    import transformers

    from kvtuner import QuantSpec
    from kvtuner.profile import ModelFingerprint, Profile, save_profile

    (snippet,) = _hf_snippets()
    assert 'load_model("smollm2-135m")' in snippet
    model_dir = save_tiny(tmp_path / "tiny")
    fingerprint = ModelFingerprint.from_config(transformers.AutoConfig.from_pretrained(model_dir))
    k, v = QuantSpec(bits=4, group_size=32), QuantSpec(bits=2, group_size=32)
    save_profile(Profile.uniform("tiny", fingerprint, k, v), tmp_path / "profile.json")
    monkeypatch.chdir(tmp_path)  # the snippet reads "profile.json"
    scope = {}
    exec(snippet.replace('"smollm2-135m"', repr(str(model_dir))), scope)
    stored, _, fp16 = capsys.readouterr().out.partition("bytes stored;")
    prompt = scope["tok"]("The capital of France is", return_tensors="pt")["input_ids"]
    assert scope["out"].shape[-1] > prompt.shape[-1]  # it generated
    # prompt + 32 new tokens fit the 128-token residual window: nothing packed yet, fp16 bytes
    assert int(stored) == int(fp16.split()[0]) > 0
