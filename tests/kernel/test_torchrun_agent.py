"""torchrun's agent as ddp_helpers runs it: what it changes in torchrun itself."""

from __future__ import annotations

from ddp_helpers.kernel.launcher.torchrun_agent import tolerate_half_written_error_files


def test_a_half_written_error_file_is_read_as_none(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    # the agent patches torchrun in its own process; here, monkeypatch puts torchrun back afterwards
    monkeypatch.setattr(ProcessFailure, "__post_init__", ProcessFailure.__post_init__)

    empty = tmp_path / "error.json"
    empty.write_text("")  # a rank stopped while @record wrote it
    whole = tmp_path / "whole.json"
    whole.write_text('{"message": {"message": "ValueError: bad", "extraInfo": {"timestamp": "1"}}}')
    tolerate_half_written_error_files()
    tolerate_half_written_error_files()  # twice: still one layer
    failure = ProcessFailure(local_rank=1, pid=42, exitcode=-6, error_file=str(empty))
    assert failure.message == "Signal 6 (SIGABRT) received by PID 42"
    whole_read = ProcessFailure(local_rank=0, pid=7, exitcode=1, error_file=str(whole))
    # a whole file is read as before: its dict (torch types message a str; its errors/__init__.py says either)
    read: object = whole_read.message
    assert isinstance(read, dict) and read["message"] == "ValueError: bad", read
