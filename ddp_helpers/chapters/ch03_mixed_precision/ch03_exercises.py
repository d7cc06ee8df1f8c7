"""Notebook 03's exercises: bf16 autocast around a DDP step's forward and loss; the fp16 step with a
GradScaler and clipping. The model is a bias-free Linear at zero: a weight's gradient is the input, exact in
16 bits; the last rank's first fp16 sample overflows, and the clean second step's norm is above max_norm.
"""

from __future__ import annotations

import math
from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, close, field_of, number

WIDTH = 4  # one input coordinate per rank (wider for more ranks)
INIT_SCALE = 32.0  # the scaler's first scale: small, so the overflow comes from one large input
BIG = 4096.0  # the last rank's first sample: BIG x INIT_SCALE = 131072 > 65504, fp16's largest
MAX_NORM = 0.25  # the clean step's gradient norm, 1/sqrt(N), is above it for 1 to 15 ranks: the clip bites
CLIP_EPS = 1e-6  # clip_grad_norm_ divides max_norm by (total_norm + 1e-6): torch 2.7 and 2.14


def _width(world: int) -> int:
    return max(WIDTH, world)


def _model(ctx: Context, outputs: int) -> tuple[Any, Any, list[str]]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = torch.nn.Linear(_width(ctx.world_size), outputs, bias=False).to(ctx.device)
    torch.nn.init.zeros_(model.weight)
    dtypes: list[str] = []
    model.register_forward_hook(lambda module, args, out: dtypes.append(str(out.dtype)))
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    return model, ddp_model, dtypes


def _weights(model: Any) -> list[float]:
    return [float(v) for v in model.weight.detach().float().cpu().flatten().tolist()]


# ------------------------------------------------------------------ 03-fp16-step
class _Steps:
    """The rank's batches; each `next` writes down the weights and scale the step before left."""

    def __init__(self, batches: list[Any], model: Any, scaler: Any) -> None:
        self.batches, self.model, self.scaler = batches, model, scaler
        self.after: list[dict[str, Any]] = []

    def __iter__(self) -> Any:
        for x in self.batches:
            yield x
            self.after.append({"weights": _weights(self.model), "scale": float(self.scaler.get_scale())})

    def __len__(self) -> int:
        return len(self.batches)


def _fp16_setup(ctx: Context) -> dict[str, Any]:
    import torch

    model, ddp_model, dtypes = _model(ctx, 1)
    width = _width(ctx.world_size)
    first = torch.zeros(1, width, device=ctx.device)
    first[0, ctx.rank] = BIG if ctx.rank == ctx.world_size - 1 else 1.0  # the last rank's overflows
    second = torch.zeros(1, width, device=ctx.device)
    second[0, ctx.rank] = 1.0
    scaler = torch.amp.GradScaler(ctx.device.type, init_scale=INIT_SCALE)  # growth_interval: 2000
    steps = _Steps([first, second], model, scaler)
    return {
        "ddp_model": ddp_model,
        "optimizer": torch.optim.SGD(ddp_model.parameters(), lr=1.0),
        "scaler": scaler,
        "batches": steps,
        "max_norm": MAX_NORM,
        "norms": [],
        "_steps": steps,  # kept aside: the answer may rebind `batches`
        "_dtypes": dtypes,
    }


def _fp16_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    steps = ns["_steps"].after if "_steps" in ns else []
    norms = [number(norm) for norm in ns.get("norms") or []]
    return {
        "output_dtypes": list(ns.get("_dtypes", [])),
        "weights": [s["weights"] for s in steps],
        "scales": [s["scale"] for s in steps],
        "norms": norms,
    }


def _clean_norm(world: int) -> float:
    """The clean step's true gradient norm: DDP averages one-hots, 1/N on each of N coordinates."""
    return math.sqrt(world * (1.0 / world) ** 2)


def _fp16_expected(world: int) -> Seen:
    width = _width(world)
    norm = _clean_norm(world)
    coef = min(1.0, MAX_NORM / (norm + CLIP_EPS))
    stepped = [-coef / world if i < world else 0.0 for i in range(width)]  # lr 1 times the clipped gradient
    half = INIT_SCALE / 2  # the overflow halved the scale; 2000 clean steps would grow it again
    row = {
        "output_dtypes": ["torch.float16", "torch.float16"],
        "weights": [[0.0] * width, stepped],  # the first step skipped, the second taken
        "scales": [half, half],
        "norms": [math.inf, norm],
    }
    return [dict(row) for _ in range(world)]


def _output_dtypes(seen: Seen) -> list[str]:
    return [d for s in seen for d in (s.get("output_dtypes") or [])]


def _after(seen: Seen, name: str, step: int) -> list[Any]:
    return [w[step] if w and len(w) > step else None for w in field_of(seen, name)]


def _skipped(seen: Seen, step: int, scale: float) -> bool:
    skipped = all(w is not None and not any(w) for w in _after(seen, "weights", step))
    return skipped and all(s is not None and close(s, scale) for s in _after(seen, "scales", step))


def _overflow_applied(seen: Seen, expected: Seen) -> bool:
    first = _after(seen, "weights", 0)
    return all(w is not None for w in first) and any(not math.isfinite(v) for w in first for v in w or [])


def _clipped_scaled(seen: Seen, expected: Seen) -> bool:
    want = _clean_norm(len(seen)) * INIT_SCALE / 2  # the scale at the second step
    norms = field_of(seen, "norms")
    return all(n and len(n) > 1 and n[1] is not None and close(n[1], want, 1e-5) for n in norms)


def _updated_before_step(seen: Seen, expected: Seen) -> bool:
    """The first step skipped, then torch's error at the next unscale_: step() came after update()."""
    errors = [s.get("error") or "" for s in seen]
    return _skipped(seen, 0, INIT_SCALE / 2) and all(
        "unscale_() is being called after step()" in e for e in errors
    )


FP16_STEP = Exercise(
    id="03-fp16-step",
    notebook="03",
    title="The fp16 step: GradScaler, unscale_ before the clip, a skip on every rank",
    task="Write the loop body: zero_grad, fp16 autocast forward, scaled backward, unscale_, clip to `max_norm` "
    "(append the norm to `norms`), step and update through the scaler.",
    starter=(
        "for x in batches:\n"
        "    ...  # TODO: clear the gradients of the step before\n"
        "    # TODO: the forward under fp16 autocast\n"
        "    loss = ddp_model(x).sum()\n"
        "    loss.backward()  # TODO: backward of the scaled loss\n"
        "    # TODO: unscale the gradients in place, before the clip\n"
        "    norms.append(torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), max_norm))\n"
        "    optimizer.step()  # TODO: a step the scaler can skip\n"
        "    # TODO: let the scaler adapt its scale\n"
    ),
    reference=(
        "for x in batches:\n"
        "    optimizer.zero_grad(set_to_none=True)  # the step before: its gradients go\n"
        "    with torch.autocast(device.type, dtype=torch.float16):  # the forward in fp16\n"
        "        loss = ddp_model(x).sum()\n"
        "    scaler.scale(loss).backward()  # loss x scale: small gradients stay representable\n"
        "    scaler.unscale_(optimizer)  # divide the scale out, in place, before the clip\n"
        "    norms.append(torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), max_norm))  # true norm\n"
        "    scaler.step(optimizer)  # skipped if any gradient is inf/NaN: on every rank alike\n"
        "    scaler.update()  # halves the scale after a skip\n"
    ),
    hint="The scaler wraps scale(loss).backward(), step(optimizer) and update(); unscale_ goes before the clip.",
    setup=_fp16_setup,
    observe=_fp16_observe,
    expected=_fp16_expected,
    mistakes=(
        Mistake(
            "03-fp16-step-not-fp16",
            "The forward's output was not float16: no fp16 autocast, so no overflow for the scaler to handle.",
            lambda seen, expected: any(d != "torch.float16" for d in _output_dtypes(seen)),
            hint="Run the forward inside `with torch.autocast(device.type, dtype=torch.float16):`.",
        ),
        Mistake(
            "03-fp16-step-optimizer-step",
            "The weights became inf/NaN on the overflowing step: optimizer.step() applies any gradient.",
            _overflow_applied,
            hint="Call scaler.step(optimizer): it skips a step whose gradients are not finite.",
        ),
        Mistake(
            "03-fp16-step-no-update",
            "The step was skipped, yet the scale stayed the same: scaler.update() was never called.",
            lambda seen, expected: _skipped(seen, 0, INIT_SCALE),  # and the scale kept
            hint="Call scaler.update() once per iteration, after scaler.step(optimizer).",
        ),
        Mistake(
            "03-fp16-step-no-zero-grad",
            "The clean second step was skipped too: the first step's inf gradients were never cleared.",
            lambda seen, expected: _skipped(seen, 1, INIT_SCALE / 4),  # the clean step too
            hint="Begin each iteration with optimizer.zero_grad(set_to_none=True).",
        ),
        Mistake(
            "03-fp16-step-clip-before-unscale",
            "The clip measured a norm the scale times too big: it clipped still-scaled gradients.",
            _clipped_scaled,
            hint="Call scaler.unscale_(optimizer) between the backward and clip_grad_norm_.",
        ),
        Mistake(
            "03-fp16-step-update-before-step",
            'The second unscale_ raised "unscale_() is being called after step()": scaler.update() ran '
            "before scaler.step(optimizer), which left the scaler marked as stepped.",
            _updated_before_step,
            hint="Call scaler.step(optimizer) first, then scaler.update(), last in the iteration.",
        ),
    ),
    covers=("autocast-fp16", "scaler-scale", "scaler-unscale", "clip", "scaler-step", "scaler-update")
    + ("zero-grad",),
    tolerance=1e-6,
)

# ------------------------------------------------------------------ 03-bf16
CLASSES = 4
SCALED = 1.0  # a local gradient of 03-bf16's probe is at most 1 - 1/CLASSES; a scaled loss's is far above


def _bf16_setup(ctx: Context) -> dict[str, Any]:
    import torch

    model, ddp_model, dtypes = _model(ctx, CLASSES)
    x = torch.zeros(1, _width(ctx.world_size), device=ctx.device)
    x[0, ctx.rank] = 1.0
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=1.0)
    # autocast is thread-local; the autograd engine runs a backward's hooks with its caller's state
    during: dict[str, list[Any]] = {"backward": [], "step": [], "gradient": []}

    def at_backward(grad: Any) -> None:
        during["backward"].append(torch.is_autocast_enabled(ctx.device.type))
        during["gradient"].append(float(grad.detach().abs().max()))  # this rank's own, before DDP's mean

    def at_step(opt: Any, args: Any, kwargs: Any) -> None:
        during["step"].append(torch.is_autocast_enabled(ctx.device.type))

    model.weight.register_hook(at_backward)
    optimizer.register_step_pre_hook(at_step)
    return {
        "ddp_model": ddp_model,
        "optimizer": optimizer,
        "x": x,
        "y": torch.tensor([ctx.rank % CLASSES], device=ctx.device),
        "_model": model,
        "_dtypes": dtypes,
        "_during": during,
    }


def _bf16_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    import torch

    loss: Any = ns.get("loss")
    model = ns["_model"]
    is_tensor = isinstance(loss, torch.Tensor) and loss.numel() == 1
    during = ns["_during"]
    notes = []
    if any(g > SCALED for g in during["gradient"]):  # no gradient of this probe exceeds 1 unscaled
        notes.append("a GradScaler scaled the loss: harmless under bf16, but only fp16 needs one")
    return {
        "output_dtypes": list(ns.get("_dtypes", [])),
        "loss_dtype": str(loss.dtype) if is_tensor else None,
        "loss": float(loss.item()) if is_tensor else None,
        "param_dtype": str(model.weight.dtype),
        "weights": _weights(model),
        "autocast_at_backward": list(during["backward"]),
        "autocast_at_step": list(during["step"]),
        "notes": notes,
    }


def _bf16_expected(world: int) -> Seen:
    width = _width(world)
    weights = [[0.0] * width for _ in range(CLASSES)]
    for r in range(world):  # zero logits: softmax 1/C; the gradient of row c is (1/C - [c == y]) x / N
        for c in range(CLASSES):
            weights[c][r] = -(1.0 / CLASSES - (1.0 if c == r % CLASSES else 0.0)) / world
    row = {
        "output_dtypes": ["torch.bfloat16"],
        "loss_dtype": "torch.float32",
        "loss": math.log(CLASSES),  # zero logits: a uniform guess, computed in fp32
        "param_dtype": "torch.float32",
        "weights": [v for line in weights for v in line],
        "autocast_at_backward": [False],  # one backward, one step, both after the autocast block
        "autocast_at_step": [False],
    }
    return [dict(row) for _ in range(world)]


def _autocast_after_forward(seen: Seen, expected: Seen) -> bool:
    return all(
        s.get("output_dtypes") == e["output_dtypes"]
        and s.get("loss_dtype") == e["loss_dtype"]
        and (any(s.get("autocast_at_backward") or []) or any(s.get("autocast_at_step") or []))
        for s, e in zip(seen, expected, strict=True)
    )


def _outputs_all(seen: Seen, dtype: str) -> bool:
    dtypes = _output_dtypes(seen)
    return bool(dtypes) and all(d == dtype for d in dtypes)


BF16 = Exercise(
    id="03-bf16",
    notebook="03",
    title="bf16 autocast around the forward and the loss",
    task="One DDP step: the forward and the loss under bf16 autocast on `device.type`; backward and the "
    "step outside it, with no GradScaler.",
    starter=(
        "# TODO: the forward and the loss under bf16 autocast\n"
        "logits = ddp_model(x)\n"
        "loss = F.cross_entropy(logits, y)\n"
        "loss.backward()\n"
        "optimizer.step()\n"
    ),
    reference=(
        "with torch.autocast(device.type, dtype=torch.bfloat16):  # the forward in bf16\n"
        "    logits = ddp_model(x)\n"
        "    loss = F.cross_entropy(logits, y)  # inside too: autocast runs the loss in fp32\n"
        "loss.backward()  # no scaler: bf16 has fp32's range\n"
        "optimizer.step()\n"
    ),
    hint="torch.autocast(device.type, dtype=...) around the forward and the loss.",
    setup=_bf16_setup,
    observe=_bf16_observe,
    expected=_bf16_expected,
    mistakes=(
        Mistake(
            "03-bf16-model-cast",
            "The weights are not float32 (param_dtype): the model was cast to 16 bits, so small updates round "
            "away (and, cast after the wrap, DDP no longer averages its gradients).",
            lambda seen, expected: all(
                s.get("param_dtype") in ("torch.bfloat16", "torch.float16") for s in seen
            ),
            hint="Leave the model in float32; autocast casts each operation's inputs in the forward only.",
        ),
        Mistake(
            "03-bf16-fp16",
            "The forward ran in float16, not bfloat16 (fp16 would need a GradScaler).",
            lambda seen, expected: "torch.float16" in _output_dtypes(seen),
            hint="Give torch.autocast dtype=torch.bfloat16.",
        ),
        Mistake(
            "03-bf16-no-autocast",
            "The forward ran in float32: no autocast was active for this rank's device type.",
            lambda seen, expected: _outputs_all(seen, "torch.float32"),
            hint="Use torch.autocast(device.type, dtype=torch.bfloat16), not a hard-coded 'cuda'.",
        ),
        Mistake(
            "03-bf16-loss-outside",
            "The loss is bfloat16: it was computed after the autocast block, on bf16 logits.",
            lambda seen, expected: (
                _outputs_all(seen, "torch.bfloat16")
                and all(s.get("loss_dtype") == "torch.bfloat16" for s in seen)
            ),
            hint="Move F.cross_entropy into the block: autocast runs it in float32.",
        ),
        Mistake(
            "03-bf16-backward-in-autocast",
            "Autocast was still on at backward or at the step (autocast_at_backward, autocast_at_step).",
            _autocast_after_forward,
            hint="End the block after the loss; backward and step go after it, unindented.",
        ),
    ),
    covers=("autocast-bf16",),
    tolerance=1e-6,
)

EXERCISES = (FP16_STEP, BF16)
