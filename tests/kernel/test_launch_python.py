"""`launch(..., launcher="python")`: one process without torchrun's agent, watched the same way."""

from __future__ import annotations

import textwrap

import pytest

from ddp_helpers import InvalidLaunchArguments, LaunchTimeout, WorkerFailed, launch


def write(tmp_path, body: str):
    path = tmp_path / "one.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_runs_a_script_with_the_environment_torchrun_would_give_a_world_of_one(tmp_path, capsys):
    script = write(
        tmp_path,
        """
        import os, sys
        import torch
        import torch.distributed as dist
        from ddp_helpers.rank.metrics import MetricsWriter

        dist.init_process_group("gloo")  # reads MASTER_ADDR/PORT, RANK and WORLD_SIZE like under torchrun
        t = torch.ones(1)
        dist.all_reduce(t)
        print(f"rank={dist.get_rank()} world={dist.get_world_size()} local={os.environ['LOCAL_RANK']} sum={t.item()}")
        print("to stderr", file=sys.stderr)
        writer = MetricsWriter(os.environ["DDP_RUN_DIR"], 0)
        writer.log(step=1, loss=0.5)
        writer.write_summary({"world_size": dist.get_world_size()})
        writer.close()
        dist.destroy_process_group()
        """,
    )
    result = launch(script, nproc=1, launcher="python", run_dir=tmp_path / "run")
    assert "[rank 0] rank=0 world=1 local=0 sum=1.0" in capsys.readouterr().out
    assert result.command[1:] == [str(script)]  # no torch.distributed.run in between
    assert "to stderr" in result.logs[0]
    assert result.metrics["step"].tolist() == [1]
    assert result.summary == {"world_size": 1}
    assert result.launcher_output == []


def test_nproc_defaults_to_one(tmp_path):
    script = write(tmp_path, "import os; print(os.environ['WORLD_SIZE'])\n")
    result = launch(script, launcher="python", run_dir=tmp_path / "run")
    assert result.logs[0] == ["1"]
    assert result.agent == "none"  # no torchrun, so no agent


def test_a_crash_without_record_names_rank_0_and_keeps_its_traceback(tmp_path):
    script = write(
        tmp_path,
        """
        for i in range(50):
            print("chatter", i)
        raise ValueError("bad shape")
        """,
    )
    with pytest.raises(WorkerFailed) as info:
        launch(script, launcher="python", run_dir=tmp_path / "run", show_ranks="none")
    assert str(info.value).splitlines()[0] == "rank 0 failed: ValueError: bad shape"
    assert info.value.exitcode == 1
    assert 'raise ValueError("bad shape")' in info.value.traceback
    assert sum(line.startswith("chatter") for line in info.value.logs[0]) == 50


def test_record_writes_its_error_file_and_a_silent_exit_code_is_reported(tmp_path):
    script = write(
        tmp_path,
        """
        import os
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def main():
            if os.environ.get("SILENT"):
                os._exit(7)
            raise KeyError("missing")

        main()
        """,
    )
    with pytest.raises(WorkerFailed) as info:
        launch(script, launcher="python", run_dir=tmp_path / "a")
    assert str(info.value).splitlines()[0] == "rank 0 failed: KeyError: 'missing'"
    assert (tmp_path / "a" / "logs" / "python" / "attempt_0" / "0" / "error.json").is_file()
    with pytest.raises(WorkerFailed) as info:
        launch(script, launcher="python", run_dir=tmp_path / "b", env={"SILENT": "1"})
    assert info.value.exitcode == 7
    assert "exited with code 7" in str(info.value)


def test_a_hang_is_stopped_and_reported(tmp_path):
    script = write(tmp_path, 'import time\nprint("waiting", flush=True)\ntime.sleep(600)\n')
    with pytest.raises(LaunchTimeout) as info:
        launch(script, launcher="python", run_dir=tmp_path / "run", timeout=3, startup_timeout=120, grace_s=1)
    assert info.value.silent_ranks == [0]
    assert "rank 0: running" in str(info.value) and "waiting" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"launcher": "mpirun"}, "launcher must be one of torchrun, python"),
        ({"launcher": "python", "nproc": 2}, "needs nproc=1"),
        ({"launcher": "python", "max_restarts": 1}, "max_restarts=0"),
    ],
)
def test_bad_launcher_arguments_are_refused(tmp_path, kwargs, message):
    script = write(tmp_path, "print(1)\n")
    with pytest.raises(InvalidLaunchArguments, match=message):
        launch(script, run_dir=tmp_path / "never", **kwargs)
    assert not (tmp_path / "never").exists()


def test_a_last_line_without_a_newline_is_shown_once_and_kept_once(tmp_path, capsys):
    # an input() prompt, print('x', end=''): shown live while the run waits, then not again at the end
    script = write(tmp_path, "import time\nprint('no newline here', end='', flush=True)\ntime.sleep(2.5)\n")
    result = launch(script, launcher="python", run_dir=tmp_path / "run", timeout=60)
    assert capsys.readouterr().out.count("no newline here") == 1
    assert result.logs[0] == ["no newline here"]


def test_a_progress_bar_on_stderr_is_shown_on_stderr_while_it_redraws(tmp_path, capsys):
    # tqdm draws on stderr: its unfinished updates must not go to stdout and its last line to stderr
    body = "import sys, time\nsys.stderr.write('\\rbar 1'); sys.stderr.flush()\ntime.sleep(2.5)\n"
    launch(
        write(tmp_path, body + "sys.stderr.write('\\rbar 2\\n')\n"), launcher="python", run_dir=tmp_path / "r"
    )
    captured = capsys.readouterr()
    assert "bar 1" in captured.err and "bar" not in captured.out, captured
