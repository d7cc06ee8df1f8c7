"""Every code excerpt a notebook shows with `show_source(...)` contains the call it is there to show.

The table maps each (worker, name) a notebook may show to a piece of code that must be in it. An
excerpt that no longer holds its call (the code moved to another function) fails here, and so does
an excerpt missing from the table: a new excerpt must be registered with what it shows.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from ddp_helpers.kernel.lab.source_view import source_of

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# (worker, function or class name; None for the whole file) -> a call the excerpt must contain
EXCERPTS: dict[tuple[str, str | None], str] = {
    ("single_device", None): "loss.backward()",
    ("ddp", None): "DDP(",
    ("train", "setup"): "setup_distributed()",
    ("train", "build_data"): "ResumableDistributedSampler(",
    ("train", "build_training"): "torch.amp.GradScaler(",
    ("train", "wrap"): "DDP(",
    ("train", "train_step"): "scaler.unscale_(",  # notebook 03: the unscale_ before the clip
    ("train", "train"): "set_epoch",
    ("train", "evaluate"): "dist.all_reduce(counts)",
    ("train_checkpoint", "save"): "barrier",
    ("train_checkpoint", "resume"): "load_latest_on_every_rank(",
    ("train", "main"): "setup(",
    # notebook 02: its companion, deeper/02, shows the phase timer (companions are not scanned here yet)
    ("train_report", "PhaseTimer"): "torch.cuda.synchronize(",
    # notebook 04
    ("checkpoint", "save_checkpoint"): "os.replace(",
    ("checkpoint", "load_latest_on_every_rank"): "broadcast_object_list(",
    ("sum_order", "sum_order"): "dist.all_reduce(flat",
    # notebook 05
    ("pitfalls", "crash"): "dist.all_reduce(",
    ("pitfalls", "hang"): "dist.all_reduce(x)",
    ("pitfalls", "monitored_barrier"): "dist.monitored_barrier(",
    ("pitfalls", "mismatch"): "dist.all_reduce(x)",
    ("pitfalls", "set_epoch"): "sampler.set_epoch(epoch)",
    ("pitfalls", "evaluate"): "DistributedSampler(",
    ("pitfalls", "TwoHeads"): "self.head_b",
    ("pitfalls", "unused"): "loss.backward()",
    ("pitfalls", "time_unused_fixes"): "static_graph",
    ("pitfalls", "slow_save"): "dist.barrier()",
    ("stack_dumps", "register"): "faulthandler.register(",
    ("pitfalls", "batchnorm"): "SyncBatchNorm",
    ("pitfalls", "uneven"): "Join(",
    # notebook 06
    ("distributed", "gpu_index"): "visible_gpus == 1",
    # notebook 07
    ("handmade_ddp", "broadcast_from_rank0"): "dist.broadcast(",
    ("handmade_ddp", "HandmadeDDP"): "handle.remove()",
    ("handmade_ddp", "NaiveDDP"): "dist.all_reduce(",
    ("handmade_ddp", "FlatDDP"): "dist.all_reduce(",
    ("handmade_ddp", "OverlapDDP"): "register_post_accumulate_grad_hook",
    ("handmade_ddp", "BucketedDDP"): "bucket_cap_mb",
    ("handmade_ddp", "train_variant"): "finish_gradient_synchronization()",
    ("experiment_kit", "train_step"): "backward()",
    ("inside_ddp", "experiment_profile"): "profile_steps(",
    ("inside_ddp", "profile_steps"): "export_chrome_trace(",
    ("inside_ddp", "experiment_allreduce"): "dist.all_reduce(buffer)",
    ("inside_ddp", "bucket_layout"): "register_comm_hook",
    ("inside_ddp", "experiment_buckets"): "bucket_cap_mb",
    ("inside_ddp", "accumulate"): "no_sync()",
    ("inside_ddp", "record_buckets_hook"): "dist.all_reduce(",
    ("inside_ddp", "storage_of"): "untyped_storage()",
    ("inside_ddp", "gradient_memory"): "register_comm_hook(",
    ("inside_ddp", "experiment_options"): "gradient_memory(",
    # notebook 08
    ("fsdp_model", "BlockMLP"): "self.blocks",
    ("fsdp_model", "shard"): "fully_shard(model, mesh=mesh",
    ("fsdp_model", "CollectiveCounter"): "original(*args, **kwargs)",
    ("fsdp_model", "gradient_factor"): "fully_shard(probe, mesh=mesh",
    ("fsdp_model", "divide_gradients"): "set_all_reduce_hook(",
    ("fsdp", "fsdp_versus_one_process"): "divide_gradients(model, probe)",
    ("fsdp_footprint", "wrapped"): "ZeroRedundancyOptimizer(",
    ("fsdp", "adam_run"): "fsdp_footprint.wrapped(",
    ("fsdp_footprint", "held_at_forward_end"): "saved_activation_bytes(model)",
    ("fsdp_meta", "whole_first"): "shard(model, mesh)",
    ("fsdp_meta", "meta_first"): "model.to_empty(device=device)",
    ("fsdp_checkpoint", "AppState"): "set_state_dict(",
    ("fsdp_checkpoint", "part_save"): "async_saves(",
    ("fsdp_checkpoint", "async_saves"): "dcp.async_save(",
    ("fsdp_checkpoint", "part_resume"): "dcp.load(state",
    # notebook 09
    ("compile_ddp", "MLP"): "nn.Linear(width, width)",
    ("compile_ddp", "GraphCounter"): "lookup_backend(self.backend)",
    ("compile_ddp", "c_compiler"): "shutil.which(",
    ("compile_ddp", "wrap"): "torch.compile(DDP(model",
    ("compile_ddp", "compiled_step"): "GraphCounter()",
    ("compile_ddp", "compiled_autograd_step"): 'mode["optimize_ddp"] = "python_reducer"',
    ("compile_ddp", "train"): "optimizer.step()",
    ("compile_ddp", "eager_against_compiled"): "DDP(torch.compile(model",
    ("compile_ddp", "epochs_of_batches"): "drop_last=drop_last",
    ("compile_ddp", "ChattyMLP"): "dist.get_rank() == 0",
    ("compile_tools", "step_with_print"): "print(",
    ("compile_tools", "add"): "return x + n",
    ("compile_tools", "breaks_and_recompiles"): "fullgraph=True",
    ("compile_tools", "recompile_limit"): "recompile_limit",
    ("compile_ddp", "checkpoint_keys"): "consume_prefix_in_state_dict_if_present(",
    ("compile_ddp", "resume_both_ways"): "load_state_dict(",
}


def _worker_name(node: ast.expr, assignments: dict[str, str]) -> str | None:
    """The worker a show_source target names: a string, or a variable assigned from a call on one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "train", "live.server", "x/y.py"
        return Path(node.value).stem if node.value.endswith(".py") else node.value
    if isinstance(node, ast.Name):
        return assignments.get(node.id)
    return None


def excerpts_shown(notebook: Path) -> list[tuple[str | None, str | None, str]]:
    """(worker, name, the call as written) for each show_source call in the notebook's code cells."""
    nb = nbformat.read(notebook, as_version=4)
    trees = []
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
            continue  # a cell magic's body runs elsewhere (on the ranks, under torchrun)
        trees.append(ast.parse(TransformerManager().transform_cell(cell.source)))
    # variables bound to a worker, e.g. `train = write_worker("train", ...)`,
    # `a, b = worker_path("x"), worker_path("y")`, or `worker = chapter.workers["train"]`
    assignments: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                for bound, value in pairs:
                    key = value.slice if isinstance(value, ast.Subscript) else None
                    if (
                        isinstance(bound, ast.Name)
                        and isinstance(key, ast.Constant)
                        and isinstance(key.value, str)
                    ):
                        assignments[bound.id] = key.value  # chapter.workers["train"]
                    if isinstance(bound, ast.Name) and isinstance(value, ast.Call) and value.args:
                        first = value.args[0]
                        if isinstance(first, ast.Constant) and isinstance(first.value, str):
                            assignments[bound.id] = Path(first.value).stem
    found = []
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if called != "show_source" or not node.args:
                continue
            worker = _worker_name(node.args[0], assignments)
            names = [str(a.value) if isinstance(a, ast.Constant) else None for a in node.args[1:]] or [None]
            for name in names:
                found.append((worker, name, ast.unparse(node)))
    return found


def test_every_registered_excerpt_contains_its_call():
    missing = [
        f"show_source({worker!r}, {name!r}) no longer contains {needed!r}"
        for (worker, name), needed in EXCERPTS.items()
        if needed not in (source_of(worker, name) if name else source_of(worker))
    ]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_excerpt_a_notebook_shows_is_registered(notebook):
    for worker, name, call in excerpts_shown(notebook):
        assert worker is not None, (
            f"{notebook.name}: {call}: name the worker with a string (or a variable set from one)"
        )
        assert (worker, name) in EXCERPTS, (
            f"{notebook.name}: {call} is not in tests/kernel/test_excerpts.py's EXCERPTS: register it with the call it shows"
        )


def test_the_first_program_notebook_shows_both_scripts():
    shown = {
        (w, n)
        for w, n, _ in excerpts_shown(
            Path(__file__).resolve().parents[2] / "notebooks" / "01_first_ddp_program.ipynb"
        )
    }
    assert ("single_device", None) in shown


def test_the_finder_reads_variables_and_skips_cell_magics(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell('%load_ext ddp_helpers\ntrain = ddp_helpers.write_worker("train", "runs")'),
        nbformat.v4.new_code_cell('a, b = worker_path("inside_ddp"), worker_path("handmade_ddp")'),
        nbformat.v4.new_code_cell(
            'show_source(train, "train_step", "wrap")\nshow_source("ddp")\nshow_source(b, "x")'
        ),
        nbformat.v4.new_code_cell('%%ranks\nshow_source("nope", "x")'),
    ]
    path = tmp_path / "07_example.ipynb"
    nbformat.write(nb, path)
    assert [(w, n) for w, n, _ in excerpts_shown(path)] == [
        ("train", "train_step"),
        ("train", "wrap"),
        ("ddp", None),
        ("handmade_ddp", "x"),
    ]
