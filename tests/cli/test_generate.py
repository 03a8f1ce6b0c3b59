"""`kvtuner generate --static`: the window options do not apply, and saying them is one line."""

from __future__ import annotations

import pytest
from test_placement_flags import kvtuner, one_line_exit_2


@pytest.mark.parametrize("option", [["--residual-length", "0"], ["--pack-chunk", "4"]])
def test_static_refuses_the_window_options(option, tmp_path):
    run = kvtuner("generate", "hello", "--uniform", "kv4", "--static", *option, cwd=tmp_path)
    one_line_exit_2(run, "--static quantizes every token: drop --residual-length/--pack-chunk")
