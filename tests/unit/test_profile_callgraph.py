"""Call-graph redundancy on small functions written by the test: what counts and what not."""
import textwrap

from seedance.profile.callgraph import output_digest, profile_call


def _module(tmp_path, source):
    import importlib.util
    path = tmp_path / "plug.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("plug_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wrapper_returning_its_callees_value_is_not_redundant(tmp_path):
    m = _module(tmp_path, """
        def inner(x):
            return [v * 2.5 for v in x]
        def wrapper(x):
            return inner(x)
        def entry(x):
            return wrapper(x)
    """)
    graph = profile_call(m.entry, list(range(50)), [str(tmp_path)])
    assert [c.function for c in graph.calls][:3] == ["plug.entry", "plug.wrapper", "plug.inner"]
    assert graph.redundancies == []


def test_same_path_twice_is_repetition_not_two_paths(tmp_path):
    m = _module(tmp_path, """
        def norm(x):
            s = sum(x)
            return [v / s for v in x]
        def entry(x):
            return [norm(x), norm(x)]
    """)
    graph = profile_call(m.entry, list(range(1, 50)), [str(tmp_path)])
    assert graph.redundancies == []


def test_two_paths_reported_at_their_highest_pair(tmp_path):
    m = _module(tmp_path, """
        def norm_a(x):
            s = sum(x)
            return [v / s for v in x]
        def norm_b(x):
            s = sum(x)
            return [v / s for v in x]
        def left(x):
            return norm_a(x)
        def right(x):
            return norm_b(x)
        def entry(x):
            return left(x), right(x)
    """)
    graph = profile_call(m.entry, list(range(1, 50)), [str(tmp_path)])
    # left/right return what norm_a/norm_b return: one redundancy, at left/right
    assert len(graph.redundancies) == 1
    r = graph.redundancies[0]
    assert {r.path_a[-1], r.path_b[-1]} == {"plug.left", "plug.right"}
    assert r.shared_prefix == ["plug.entry"]


def test_small_outputs_never_match():
    assert output_digest(None)[0] is None and output_digest(3)[0] is None and output_digest(b"ab")[0] is None
    assert output_digest(b"x" * 64)[0] == output_digest(bytearray(b"x" * 64))[0]
    assert output_digest([1.0] * 10)[0] != output_digest([1.0] * 11)[0]
