"""Notebook 09's compile tools, in this process: explain(), fullgraph=True, the recompiles log, the limit."""

from __future__ import annotations

from ddp_helpers.chapters.ch09_compile import compile_tools


def test_explain_fullgraph_and_the_recompiles_log_see_the_print_and_the_new_shape():
    seen = compile_tools.breaks_and_recompiles()
    assert (seen["explain"]["graphs"], seen["explain"]["breaks"]) == (2, 1)
    assert seen["graph_breaks_log"] and seen["graph_breaks_log"][0].startswith("Graph break")
    assert seen["fullgraph"].startswith("Unsupported")
    assert len(seen["recompiles"]) == 1 and "size mismatch" in seen["recompiles"][0]


def test_past_the_recompile_limit_dynamo_runs_eagerly_after_one_warning():
    seen = compile_tools.recompile_limit()
    limit = seen["limit"]
    assert seen["limit_graphs"] == limit == 8
    assert seen["limit_results"] == [float(n) for n in range(limit + 2)]
    assert seen["limit_warnings"] == [f"torch._dynamo hit config.recompile_limit ({limit})"]
