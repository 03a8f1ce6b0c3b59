"""The skip-set rules: boundary and largest-keys sets, greedy forward selection (which sees the
interactions that single-layer sensitivity misses), rule attribution."""

from kvtuner.tuner.vllm.candidates import additive, boundary, greedy, largest_keys, merge_rules

W = (0.1, 1.0, 0.5, 0.2)  # damage of each layer stored in D


def _damage(skip: tuple[int, ...]) -> float:
    """Layers 0 and 2 together in D cost 5 more than apart (errors compounding)."""
    quantized = set(range(4)) - set(skip)
    return sum(W[i] for i in quantized) + (5.0 if {0, 2} <= quantized else 0.0)


def _measure_all(seen: dict):
    def measure(sets):
        for s in sets:
            seen.setdefault(s, _damage(s))
        return dict(seen)

    return measure


def test_greedy_finds_what_the_additive_rule_misses():
    only_l_in_d = [_damage(tuple(j for j in range(4) if j != i)) for i in range(4)]
    order = sorted(range(4), key=lambda i: -only_l_in_d[i])
    assert order[0] == 1 and _damage((1,)) == 5.8  # additive: layer 1 looks most sensitive
    seen: dict = {}
    chain = greedy(_measure_all(seen), 4, 2, log=lambda _: None)
    assert chain == [(2,), (1, 2)]
    assert _damage((2,)) == 1.3 < _damage(tuple(additive(order, 1, 10)[1]))
    assert len(seen) == 1 + 4 + 3  # D everywhere, then every layer, then every remaining one


def test_greedy_stops_when_nothing_helps():
    seen = {(): 1.0}
    flat = lambda sets: {**{s: seen.setdefault(s, 1.0) for s in sets}, **seen}  # noqa: E731
    lines = []
    assert greedy(flat, 3, 2, log=lines.append) == []
    assert "no layer lowers" in lines[-1]


def test_boundary_largest_keys_additive_and_merge():
    assert boundary(24, 4) == [(0, 1, 22, 23)]
    assert boundary(24, 3) == [(0, 1, 23)] and boundary(24, 0) == []
    assert largest_keys([1.0, 9.0, 3.0, 9.0], 2) == [(1, 3)] and largest_keys([1.0], 0) == []
    sets = additive([3, 0, 2, 1], 2, limit=10)
    assert sets[0] == () and sets[1] == (0, 3) and (2, 3) in sets and (1, 3) in sets
    assert len(additive([3, 0, 2, 1], 2, limit=3)) == 3
    rules = merge_rules({"greedy": [(0, 3)], "boundary": [(0, 3)], "additive": [(), (0,)]})
    assert rules == {(0, 3): "greedy+boundary", (): "additive", (0,): "additive"}
