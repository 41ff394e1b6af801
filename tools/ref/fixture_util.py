"""Shared helpers for the tools/ref/ fixture generators: repo paths, determinism, MANIFEST.json.

Not a script. Every generator imports it to (1) pin torch to one thread and deterministic
algorithms, (2) write tensors with safetensors, and (3) merge its own entries into
tests/golden/fixtures/MANIFEST.json without touching the other generators' entries.
"""
import json
import os
import platform
import sys

import numpy as np

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES_DIR = os.path.join(REPO_ROOT, "tests", "golden", "fixtures")
MANIFEST_PATH = os.path.join(FIXTURES_DIR, "MANIFEST.json")


def setup_torch():
    """One thread (the machine is shared) and deterministic kernels."""
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def versions():
    """Versions of the packages the generator ran with (torch and transformers only where imported:
    the generators that do not need them run without them)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "safetensors", "numpy", "gguf"):
        if pkg in ("torch", "transformers") and pkg not in sys.modules:
            continue
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:  # gguf is only needed by some generators
            pass
    return out


def rel(path):
    """Path relative to the repo root, '/'-separated (what MANIFEST records)."""
    return os.path.relpath(os.path.abspath(path), REPO_ROOT).replace(os.sep, "/")


def dir_size(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def describe(tensors, descriptions):
    """{name: {dtype, shape, what}} for the manifest; every tensor must be described."""
    out = {}
    for name, t in tensors.items():
        if name not in descriptions:
            raise KeyError(f"tensor {name!r} has no description for MANIFEST")
        out[name] = {
            "dtype": str(t.dtype).replace("torch.", ""),
            "shape": list(t.shape),
            "what": descriptions[name],
        }
    return out


def save_expected(fixture_dir, tensors):
    """Writes fixture_dir/expected.safetensors (contiguous CPU tensors, sorted by name)."""
    from safetensors.torch import save_file

    os.makedirs(fixture_dir, exist_ok=True)
    clean = {k: tensors[k].detach().cpu().contiguous() for k in sorted(tensors)}
    save_file(clean, os.path.join(fixture_dir, "expected.safetensors"), metadata={"format": "pt"})


def update_manifest(entries, generator):
    """Merges {fixture_name: entry} into MANIFEST.json (other fixtures' entries are kept)."""
    if os.path.exists(MANIFEST_PATH):
        with open(MANIFEST_PATH) as f:
            manifest = json.load(f)
    else:
        manifest = {}
    manifest.setdefault(
        "about",
        "Golden fixtures for tests/golden: reference tensors computed by PyTorch/transformers with the "
        "scripts in tools/ref/ (see tools/ref/README.md). Paths are relative to the repo root. Each "
        "fixture: `model_dir` (HF config.json + model.safetensors, when the fixture has one), "
        "`expected` (safetensors of reference tensors, described under `tensors`), and recommended "
        "`tolerances` with the reason. Only the generator named in an entry rewrites that entry.",
    )
    fixtures = manifest.setdefault("fixtures", {})
    for name, entry in entries.items():
        entry = dict(entry)
        entry["generator"] = generator
        entry["versions"] = versions()
        fixtures[name] = entry
    manifest["fixtures"] = {k: fixtures[k] for k in sorted(fixtures)}
    os.makedirs(FIXTURES_DIR, exist_ok=True)
    with open(MANIFEST_PATH, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")


def top_k(logits, k):
    """(values f32, indices i64) of the k largest along the last dim, ties broken by lower index."""
    import torch

    # torch.topk's tie order is unspecified; sort by (-value, index) for a stable answer.
    vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
    return vals[..., :k].contiguous(), idx[..., :k].contiguous()


def log(*args):
    print(*args, file=sys.stderr, flush=True)
