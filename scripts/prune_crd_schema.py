"""Keep of a CRD's schema only what a generated manifest uses: the test data for tests/chapters/ch06_scaling_out/test_trainjob.py.

    python scripts/prune_crd_schema.py CRD.yaml OUT.json

CRD.yaml: kubeflow/trainer's manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml at a released tag.
The manifest is `trainjob_manifest` at its fullest (GPUs, a checkpoint folder, restarts). What is kept, at
each field the manifest sets: the type, `required`, `enum`, `format`, bounds and int-or-string. Dropped:
descriptions, CEL rules (x-kubernetes-validations, which jsonschema cannot run) and every field the
workbench does not write. So the test holds what it relies on, not a copy of the CRD: a field added to the
generator and not found here fails the test until this is run again against the CRD.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

KEPT = set(
    "type required enum format minimum maximum maxItems maxLength pattern x-kubernetes-int-or-string anyOf".split()
)


def prune(schema: dict[str, Any], value: Any) -> dict[str, Any]:
    kept = {k: v for k, v in schema.items() if k in KEPT}
    if isinstance(value, dict) and "properties" in schema:
        kept["properties"] = {
            key: prune(schema["properties"][key], item)
            for key, item in value.items()
            if key in schema["properties"]
        }
        kept["required"] = [r for r in schema.get("required", []) if r in value or r in kept["properties"]]
        if not kept["required"]:
            kept.pop("required")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        kept["additionalProperties"] = {k: v for k, v in schema["additionalProperties"].items() if k in KEPT}
    if isinstance(value, list) and "items" in schema:
        merged: dict[str, Any] = {}
        for item in value:  # every item's fields, under the one item schema
            merged = _merge(merged, item)
        kept["items"] = prune(schema["items"], merged)
    return kept


def _merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a.get(k), b.get(k)) if k in a and k in b else a.get(k, b.get(k)) for k in a | b}
    return b if a is None else a


def main(crd_path: str, out_path: str) -> int:
    from ddp_helpers.chapters.ch06_scaling_out.ch06_trainjob import trainjob_manifest

    crd = yaml.safe_load(Path(crd_path).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    example = trainjob_manifest(
        "ddp_helpers/workers/train.py", ["--epochs", 1], checkpoint_dir="/shared/ckpt"
    )
    documents = list(yaml.safe_load_all(example))
    job = next(d for d in documents if d["kind"] == "TrainJob")
    Path(out_path).write_text(json.dumps(prune(schema, job), indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
