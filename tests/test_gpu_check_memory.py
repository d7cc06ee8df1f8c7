"""`make gpu-check`'s memory part: its run and its rows, as far as a CPU can check them (no processes)."""

from __future__ import annotations

from gpu_check import memory_plan, memory_rows  # scripts/, on pytest's pythonpath

from ddp_helpers.kernel.lab.plan_core import plan_for


def test_eight_gpus_measure_notebook_08s_training_job_where_its_plan_puts_it():
    run = memory_plan(8)
    sizes = plan_for("08", 8, 8).sizes
    assert (run["nproc"], run["backend"], run["device"], run["env"]) == (8, "auto", "cuda", {})
    assert run["args"] == [
        "--part",
        "peak",
        "--width",
        sizes["width"],
        "--depth",
        sizes["depth"],
        "--global-batch",
        24,
    ]
    assert run["predicted"]["fsdp2"] < run["predicted"]["ddp"]  # 1/8 of the weights, gradients and Adam


def test_rows_hold_both_numbers_and_their_ratio_and_no_ratio_without_a_peak():
    peaks: dict[str, list[dict]] = {
        "ddp": [{"peak": 300}, {"peak": 400}],
        "fsdp2": [{"peak": None}, {"peak": None}],
    }
    rows = memory_rows({"ddp": 200, "fsdp2": 100}, peaks)
    assert rows[0] == {
        "strategy": "ddp",
        "predicted_forward_end_bytes": 200,
        "measured_peak_bytes": 400,  # the fullest rank
        "peak_over_predicted": 2.0,
    }
    assert rows[1]["measured_peak_bytes"] is None and rows[1]["peak_over_predicted"] is None
