"""Notebook 03's exercises: bf16 autocast around the forward and the loss of a DDP step, and the fp16 step
with a GradScaler and gradient clipping under DDP (one rank's overflow skips the step everywhere).

Each asks for a variation of a worked example the notebook shows above it, not a copy: the notebook runs
autocast on one plain layer in its own process, on the CPU, with an MSE loss (03-bf16 asks for a wrapped
model on the rank's device, with cross-entropy and a step), and drives a GradScaler by hand on one layer
without autocast or clipping (03-fp16-step adds fp16 autocast, DDP, and the clip after unscale_).

Probe inputs make each mistake leave its own mark. The model is a bias-free Linear that starts at zero,
so a weight's gradient is the input itself and every number is exact in 16 bits. In 03-fp16-step the
last rank's first sample is 4096: times the scale (32) that gradient passes fp16's largest number
(65504) and becomes inf, which DDP's average carries to every rank. The second step is clean, and its
gradient norm is above `max_norm`, so the clip bites: the norm the clip saw tells a clip of scaled
gradients (the scale times too big) from one of true gradients. The batches record each rank's weights
and scale after every step, and a hook records the dtype of every forward's output. In 03-bf16 a hook on
the weight records whether autocast was on when backward reached it (and how large the rank's own
gradient was: a GradScaler's scale shows there), and an optimizer pre-hook whether it was on at the step.
"""

from __future__ import annotations

import math
from typing import Any

from ddp_helpers.rank.spec import Context, Exercise, Mistake, Seen, close, field_of

WIDTH = 4  # one input coordinate per rank (wider for more ranks)
INIT_SCALE = 32.0  # the scaler's first scale: small, so the overflow comes from one large input
BIG = 4096.0  # the last rank's first sample: BIG x INIT_SCALE = 131072 > 65504, fp16's largest
MAX_NORM = 0.25  # the clean step's gradient norm, 1/sqrt(N), is above it for 1 to 15 ranks: the clip bites
CLIP_EPS = 1e-6  # clip_grad_norm_ divides max_norm by (total_norm + 1e-6): torch 2.7 and 2.14


def _width(world: int) -> int:
    return max(WIDTH, world)


def _model(ctx: Context, outputs: int) -> tuple[Any, Any, list[str]]:
    """A bias-free float32 Linear at zero, its DDP wrapper, and the dtypes its forwards returned."""
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
    """The rank's batches; each time the loop asks for the next one, the step before is written down."""

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


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _fp16_observe(ns: dict[str, Any], ctx: Context) -> dict[str, Any]:
    steps = ns["_steps"].after if "_steps" in ns else []
    norms = [_float(norm) for norm in ns.get("norms") or []]
    return {
        "output_dtypes": list(ns.get("_dtypes", [])),
        "weights": [s["weights"] for s in steps],
        "scales": [s["scale"] for s in steps],
        "norms": norms,
    }


def _clean_norm(world: int) -> float:
    """The second step's true gradient norm: DDP averages one-hots, 1/N on each of N coordinates."""
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
    """Every rank's `name` ("weights", "scales") after step `step` (None where it took fewer steps)."""
    return [w[step] if w and len(w) > step else None for w in field_of(seen, name)]


def _skipped(seen: Seen, step: int, scale: float) -> bool:
    """Every rank skipped step `step` (its weights still zero), and its scale is then `scale`."""
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
    """The first step skipped and the scale halved, then torch's own error at the next unscale_: the step
    that came after update() left the scaler marked as stepped, and no update() came to ready it again."""
    errors = [s.get("error") or "" for s in seen]
    return _skipped(seen, 0, INIT_SCALE / 2) and all(
        "unscale_() is being called after step()" in e for e in errors
    )


FP16_STEP = Exercise(
    id="03-fp16-step",
    notebook="03",
    title="The fp16 step: GradScaler, unscale_ before the clip, a skip on every rank",
    task=(
        "The notebook drove a GradScaler by hand on one layer; here is the whole fp16 step under DDP, "
        "with gradient clipping added. Write the body of the training loop: clear the gradients, run the forward "
        "under fp16 autocast, backward through the scaler, unscale the gradients in place, clip them to "
        "`max_norm` (append the norm `clip_grad_norm_` returns to `norms`), then step and update through "
        "the scaler. On the first step the last rank's gradient overflows fp16: every rank must skip it."
    ),
    given=(
        "`ddp_model` (a bias-free Linear at zero, wrapped), `optimizer` (SGD, lr 1), `scaler` "
        "(`torch.amp.GradScaler(device.type, init_scale=32.0)`), `batches` (two, one sample each), "
        "`max_norm` (0.25), `norms` (an empty list), `device`"
    ),
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
    hint="The scaler wraps three calls: scale(loss).backward(), step(optimizer) and update(). unscale_"
    "(optimizer) goes between backward and the clip, so that the clip measures true gradients. And "
    "gradients add up across backward() calls until something clears them.",
    setup=_fp16_setup,
    observe=_fp16_observe,
    expected=_fp16_expected,
    mistakes=(
        Mistake(
            "03-fp16-step-not-fp16",
            "the forward's output was not float16: without torch.autocast(device.type, dtype=torch.float16) "
            "the step is not the fp16 step (the overflow, and what the scaler does about it, never happen)",
            lambda seen, expected: any(d != "torch.float16" for d in _output_dtypes(seen)),
            hint="Run the forward inside `with torch.autocast(device.type, dtype=torch.float16):` (the "
            "tensors' own device type), and the backward, unscale_, clip, step and update after it.",
        ),
        Mistake(
            "03-fp16-step-optimizer-step",
            "the weights became inf/NaN on the overflowing step: optimizer.step() applies any gradient; "
            "scaler.step(optimizer) skips the step when a gradient is not finite",
            _overflow_applied,
            hint="Step through the scaler: scaler.step(optimizer) in place of optimizer.step(). It finds the "
            "inf that DDP's average carried to every rank and skips the step on all of them alike.",
        ),
        Mistake(
            "03-fp16-step-no-update",
            "the step was skipped, yet the scale stayed the same: without scaler.update() the scale never "
            "shrinks after an overflow (and the next unscale_ refuses to run)",
            lambda seen, expected: _skipped(seen, 0, INIT_SCALE),  # and the scale kept
            hint="Call scaler.update() once per iteration, after scaler.step(optimizer): it halves the scale "
            "after a skipped step (and grows it after 2000 clean ones).",
        ),
        Mistake(
            "03-fp16-step-no-zero-grad",
            "the clean second step was skipped too, and the scale halved twice: the first step's inf/NaN "
            "gradients stayed and the second backward added to them. Clear the gradients every step",
            lambda seen, expected: _skipped(seen, 1, INIT_SCALE / 4),  # the clean step too
            hint="Begin each iteration with optimizer.zero_grad(set_to_none=True), so that the skipped "
            "step's inf gradients are gone before the next backward adds to .grad.",
        ),
        Mistake(
            "03-fp16-step-clip-before-unscale",
            "the clip measured a norm the scale times too big: it saw the gradients still multiplied by the "
            "scale, and cut the step by that factor. Call scaler.unscale_(optimizer) before clipping",
            _clipped_scaled,
            hint="Call scaler.unscale_(optimizer) right after scaler.scale(loss).backward() and before "
            "clip_grad_norm_: the clip then measures true gradients, and scaler.step knows not to unscale "
            "them again.",
        ),
        Mistake(
            "03-fp16-step-update-before-step",
            "the first step was skipped and the scale halved, then the second iteration's unscale_ raised "
            'torch\'s "unscale_() is being called after step()" (a line after the mistake): scaler.update() '
            "ran before scaler.step(optimizer). update() reads what unscale_ found and resets the scaler's "
            "record of the iteration, so the step after it unscales the gradients again (by the new scale) "
            "and leaves the scaler marked as stepped, with no update() after it to ready the next iteration",
            _updated_before_step,
            hint="Call scaler.step(optimizer) first and scaler.update() after it, last in the iteration: step "
            "skips or applies the unscaled gradients, and update then sets the scale for the next "
            "iteration and readies the scaler for its unscale_.",
        ),
    ),
    covers=(
        "autocast-fp16",
        "scaler-scale",
        "scaler-unscale",
        "clip",
        "scaler-step",
        "scaler-update",
        "zero-grad",
    ),
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
    # was autocast on for this device when backward reached the weight, and when the optimizer stepped?
    # (autocast is thread-local; the autograd engine runs a backward's hooks with its caller's state)
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
        notes.append(
            "a GradScaler scaled the loss: harmless under bf16 (its power-of-two scale is exact, and with "
            "float32's range nothing overflows), but only fp16 needs one"
        )
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
    """The forward (and the loss) ran as a right answer's, but autocast was still on at backward or step."""
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
    task=(
        "One DDP training step of a fresh model (no gradients yet to clear): the forward and the loss "
        "under bf16 autocast, on this rank's device type; backward and the optimizer step stay outside "
        "it, with no GradScaler. (The notebook shows autocast on one layer in one process, on the CPU, "
        "with another loss: here it is the wrapped model, on whatever device the rank has.)"
    ),
    given=(
        "`ddp_model` (a bias-free Linear at zero, wrapped: no gradients yet), `optimizer` (SGD, lr 1), "
        "`x`, `y`, `device`, `F`"
    ),
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
    hint="torch.autocast takes the device type of the tensors it should act on (device.type) and a dtype. "
    "Put the loss inside it too: autocast computes it in fp32.",
    setup=_bf16_setup,
    observe=_bf16_observe,
    expected=_bf16_expected,
    mistakes=(
        Mistake(
            "03-bf16-model-cast",
            "the model's weights are not float32 after the step (see param_dtype): the model itself was cast "
            "to 16 bits, so the optimizer updated 16-bit weights, whose 8 significant bits (in bf16) round a "
            "small update away. Cast after the DDP wrap, the weights also left DDP's reach (a parameter whose "
            "dtype changes gets a new gradient accumulator, without DDP's hook): nothing averaged the "
            "gradients, and each rank stepped with its own. Mixed precision keeps the weights in float32; "
            "autocast casts each operation's inputs, for the forward only (torch's autocast docs: do not call "
            "half() or bfloat16() on the model or the inputs when autocasting)",
            lambda seen, expected: all(
                s.get("param_dtype") in ("torch.bfloat16", "torch.float16") for s in seen
            ),
            hint="Leave the model and x as they are (float32) and put the forward and the loss inside "
            "`with torch.autocast(device.type, dtype=torch.bfloat16):`, which runs the forward's operations "
            "in bf16 while the weights, their gradients and the step stay float32.",
        ),
        Mistake(
            "03-bf16-fp16",
            "the forward ran in float16, not bfloat16: fp16's narrow range needs a GradScaler; bf16 "
            "(dtype=torch.bfloat16) has fp32's range and needs none",
            lambda seen, expected: "torch.float16" in _output_dtypes(seen),
            hint="Give torch.autocast dtype=torch.bfloat16: bf16 keeps float32's 8-bit exponent, so nothing "
            "overflows and the step needs no scaler.",
        ),
        Mistake(
            "03-bf16-no-autocast",
            "the forward ran in float32: no autocast was active for this device. torch.autocast takes the "
            "tensors' device type, device.type here (torch.autocast('cuda') leaves CPU tensors in fp32)",
            lambda seen, expected: _outputs_all(seen, "torch.float32"),
            hint="Open the block with torch.autocast(device.type, dtype=torch.bfloat16): device.type is the "
            "type of the device this rank's tensors are on ('cpu' or 'cuda'), and autocast acts on that "
            "type's tensors only.",
        ),
        Mistake(
            "03-bf16-loss-outside",
            "the loss is bfloat16: it was computed after the autocast block, on bf16 logits. Inside the "
            "block autocast runs cross_entropy in fp32",
            lambda seen, expected: (
                _outputs_all(seen, "torch.bfloat16")
                and all(s.get("loss_dtype") == "torch.bfloat16" for s in seen)
            ),
            hint="Move the F.cross_entropy line into the with block, right under the forward: autocast "
            "itself picks float32 for the loss, from the bf16 logits.",
        ),
        Mistake(
            "03-bf16-backward-in-autocast",
            "the forward and the loss are right, but autocast was still on when backward() reached the "
            "weights, or when the optimizer stepped (autocast_at_backward, autocast_at_step below): they ran "
            "inside the autocast block. torch's autocast docs: autocast should wrap only the forward pass, "
            "loss included; backward passes under autocast are not recommended (each backward op already "
            "runs in the dtype autocast chose for its forward op)",
            _autocast_after_forward,
            hint="End the with block after the loss: loss.backward() and optimizer.step() go after it, "
            "unindented, where autocast is off.",
        ),
    ),
    covers=("autocast-bf16",),
    tolerance=1e-6,
)

EXERCISES = (FP16_STEP, BF16)
