"""ddp_helpers.kernel.lab.doctor and `python -m ddp_helpers doctor`."""

from __future__ import annotations

import json

import pytest

from ddp_helpers.__main__ import main
from ddp_helpers.kernel.lab import doctor as env
from ddp_helpers.kernel.lab.measures import scaling_efficiency


def test_shm_below_one_gib_warns_with_the_docker_fix():
    check = env.check_shm(64 * 2**20)
    assert check.status == env.WARN
    assert "--ipc=host" in check.advice and "--shm-size" in check.advice
    assert env.check_shm(8 * 2**30).status == env.PASS
    assert env.check_shm(None).status == env.INFO


def test_old_torch_fails_and_mismatched_torchvision_warns():
    assert env.check_torch("2.6.0", "0.21.0")[0].status == env.FAIL
    assert [c.status for c in env.check_torch("2.7.1+cu128", "0.22.1")] == [env.PASS, env.PASS]
    torchvision = env.check_torch("2.14.1", "0.22.1")[1]
    assert torchvision.status == env.WARN and "0.29" in torchvision.advice


def test_this_machine_has_no_failing_check_and_cuda_is_info_without_gpus():
    facts = env.collect_facts()
    checks = env.run_checks(facts)
    assert not [c for c in checks if c.status == env.FAIL]
    cuda = next(c for c in checks if c.name == "CUDA")
    assert cuda.status == (env.PASS if facts["cuda_available"] else env.INFO)
    assert env.exit_code(checks) == 0
    assert env.exit_code([*checks, env.Check("x", env.FAIL, "broken")]) == 1


def test_scaling_efficiency_is_per_device():
    assert scaling_efficiency(380.0, 100.0, 4) == pytest.approx(0.95)


def test_doctor_cli_runs_the_live_allreduce_and_checks_its_figures(capsys):
    # in-process: the CLI's main(argv); the all_reduce itself still runs under torchrun
    assert main(["doctor", "--max-bytes", "16384", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"python", "torch", "shm_bytes", "backends"} <= report["facts"].keys()
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["all_reduce sum (live)"] == "PASS" and statuses["all_reduce busbw (live)"] == "INFO"
    bench = report["allreduce"]
    assert bench["all_correct"] and bench["world_size"] == 2
    assert [r["bytes"] for r in bench["results"]] == [1024, 4096, 16384]
    for row in bench["results"]:
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (2 - 1) / 2)


def test_doctor_cli_table_without_the_live_check(capsys):
    assert main(["doctor", "--no-live"]) == 0
    out = capsys.readouterr().out
    assert "PASS  torch" in out and "/dev/shm" in out
    assert "all_reduce" not in out
