"""`kvtuner search --target`: its choices are the registry's; an unknown one is one line, exit 2."""

from kvtuner.cli.main import build_parser, main
from kvtuner.tuner.registry import TARGETS


def test_the_target_choices_are_the_registry(capsys):
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    target = sub.choices["search"]._option_string_actions["--target"]
    assert tuple(target.choices) == tuple(TARGETS) and target.default == "pool"


def test_an_unknown_target_exits_2_with_one_line(tmp_path, capsys):
    argv = ["search", "--target", "nope", "--model", "m", "--output", str(tmp_path / "p.json")]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses the choice
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "--target" in err and "'nope'" in err and "pool" in err
    assert not (tmp_path / "p.json").exists()
