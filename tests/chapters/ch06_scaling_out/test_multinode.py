"""Two torchrun agents on loopback, as two "nodes", meeting at a c10d rendezvous; and templates."""

from __future__ import annotations

import re
import subprocess
import threading

import pytest
import yaml

from ddp_helpers import LaunchFailed, launch
from ddp_helpers.chapters.ch06_scaling_out.ch06_cluster_templates import slurm_script, write_cluster_templates
from ddp_helpers.kernel.launcher.machine import free_port


@pytest.mark.heavy  # its two agents start in threads, where the fast tier cannot skip them
def test_two_nodes_on_loopback_form_one_world(script, tmp_path):
    worker, endpoint = script("two_nodes.py"), f"127.0.0.1:{free_port()}"
    results, errors = {}, []

    def node(node_rank):
        try:
            results[node_rank] = launch(
                worker,
                nproc=1,
                nnodes=2,
                node_rank=node_rank,
                rdzv_endpoint=endpoint,
                rdzv_timeout=60,
                run_dir=tmp_path / f"node{node_rank}",
                timeout=120,
            )
        except Exception as err:  # noqa: BLE001 - asserted below
            errors.append(err)

    threads = [threading.Thread(target=node, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    lines = [line for r in results.values() for log in r.logs.values() for line in log if "sum" in line]
    matched = [re.match(r"rank (\d) of 2 on node (\d): sum 3", line) for line in lines]
    assert all(matched), lines
    found = sorted(m.groups() for m in matched if m)
    assert found == [("0", "0"), ("1", "1")]  # one rank per node, and the sum crossed both
    for result in results.values():  # each agent labels its worker with the rank it really got
        (rank,) = result.logs
        assert any(f"rank {rank} of 2" in line for line in result.logs[rank])


def test_a_node_that_never_arrives_times_out_clearly(script, tmp_path, capsys):
    with pytest.raises(LaunchFailed, match="rendezvous timed out: not all 2 nodes joined"):
        launch(
            script("two_nodes.py"),
            nproc=1,
            nnodes=2,
            node_rank=0,
            rdzv_endpoint=f"127.0.0.1:{free_port()}",
            rdzv_timeout=8,
            run_dir=tmp_path / "alone",
        )
    # while it waits, the cell says so, and for how long
    assert re.search(r"node 0: waiting for all 2 nodes to join at .*: \d+s of 8s", capsys.readouterr().out)


def test_slurm_script_starts_one_agent_per_node_at_a_c10d_rendezvous(tmp_path):
    text = slurm_script("train.py", ["--steps", 100], nnodes=4, nproc_per_node=8, partition="gpu")
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --partition=gpu" in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text and "MASTER_ADDR=" not in text
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "torchrun --nnodes 4 --nproc-per-node 8 --max-restarts 3 --tee 3 --rdzv-backend c10d" in srun
    assert '--rdzv-endpoint "$head_addr:$rdzv_port" train.py --steps 100' in srun
    (tmp_path / "job.sh").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")]).returncode == 0  # valid shell


def test_templates_are_written_side_by_side(tmp_path):
    paths = write_cluster_templates(
        tmp_path, "train.py", ["--epochs", 1], nnodes=2, nproc_per_node=2, image="x"
    )
    assert paths["slurm"].read_text().startswith("#!/bin/bash")
    (job,) = [doc for doc in yaml.safe_load_all(paths["kubernetes"].read_text()) if doc["kind"] == "TrainJob"]
    assert job["spec"]["trainer"]["numProcPerNode"] == 2
    with pytest.raises(ValueError):
        slurm_script("train.py", nnodes=0)
