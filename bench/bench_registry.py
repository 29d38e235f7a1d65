"""Model registry: register + load of a ~200 MB state dict vs plain ``torch.save`` + ``torch.load``.

Arms, alternated in one process on the same local disk, medians reported:

* ``register+load``: ``ModelRegistry.register(state_dict=...)`` (safetensors encode, sha256,
  staging, exclusive revision claim, publish) then ``load_state_dict`` (read, sha256 check,
  decode);
* ``torch.save+torch.load``: the same dict saved to a new file (as each registration is a
  new revision) and read back with ``torch.load(weights_only=True)``;
* ``load`` alone: ``load_state_dict`` of a registered revision vs ``torch.load`` of the file.

Targets: register+load at most 1.3x the raw pair; load at least as fast as ``torch.load``
(ratio <= 1.0).

    .venv/bin/python bench/bench_registry.py [--mb 200] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import NOISE_NOTE, alternate, median, print_table, timed, write_results  # noqa: E402

from michelangelo.lib.model_registry import ModelRegistry  # noqa: E402


def make_state_dict(megabytes: int) -> dict[str, torch.Tensor]:
    """Square fp32 ``Linear`` weights plus biases, about ``megabytes`` MB in total."""
    dim = 2048
    per_layer = dim * dim * 4
    layers = max(1, round(megabytes * 1e6 / per_layer))
    generator = torch.Generator().manual_seed(0)
    out = {}
    for i in range(layers):
        out[f"layers.{i}.weight"] = torch.randn(dim, dim, generator=generator)
        out[f"layers.{i}.bias"] = torch.randn(dim, generator=generator)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="state dict size in MB")
    parser.add_argument("--reps", type=int, default=5, help="alternated rounds per pair of arms")
    args = parser.parse_args()

    state_dict = make_state_dict(args.mb)
    size = sum(t.numel() * t.element_size() for t in state_dict.values())
    root = tempfile.mkdtemp(prefix="ma-bench-registry-")
    try:
        registry = ModelRegistry(os.path.join(root, "registry"))
        raw_path = os.path.join(root, "raw.pt")
        counter = iter(range(10**6))

        def ours_roundtrip() -> None:
            spec = registry.register("bench", f"m{next(counter)}", state_dict=state_dict)
            registry.load_state_dict(spec)

        def raw_roundtrip() -> None:
            # A new file each round, as each registration is a new revision: overwriting one
            # file would reuse its page-cache pages, which no new checkpoint gets.
            path = os.path.join(root, f"raw-{next(counter)}.pt")
            torch.save(state_dict, path)
            torch.load(path, map_location="cpu", weights_only=True)

        # Warm-up: first-touch costs (imports, page cache, allocator) out of the measurement.
        ours_roundtrip()
        raw_roundtrip()
        pair = alternate({"register+load": timed(ours_roundtrip),
                          "torch.save+torch.load": timed(raw_roundtrip)}, args.reps)

        fixed = registry.register("bench", "fixed", state_dict=state_dict)
        torch.save(state_dict, raw_path)
        loads = alternate({
            "load_state_dict": timed(lambda: registry.load_state_dict(fixed)),
            "torch.load": timed(lambda: torch.load(raw_path, map_location="cpu",
                                                   weights_only=True)),
        }, args.reps)
        loaded = registry.load_state_dict(fixed)
        assert all(torch.equal(loaded[k], v) for k, v in state_dict.items())
        stored = registry.get(fixed).weights_bytes
    finally:
        shutil.rmtree(root, ignore_errors=True)

    medians = {name: median(values) for name, values in {**pair, **loads}.items()}
    roundtrip_ratio = medians["register+load"] / medians["torch.save+torch.load"]
    load_ratio = medians["load_state_dict"] / medians["torch.load"]
    print_table(
        f"state dict of {size / 1e6:.0f} MB ({len(state_dict)} tensors), {args.reps} rounds",
        ["arm", "median s", "vs raw", "target"],
        [["register+load", medians["register+load"], roundtrip_ratio, "<= 1.3"],
         ["torch.save+torch.load", medians["torch.save+torch.load"], 1.0, ""],
         ["load_state_dict (sha256 checked)", medians["load_state_dict"], load_ratio, "<= 1.0"],
         ["torch.load", medians["torch.load"], 1.0, ""]],
    )
    print(NOISE_NOTE)
    write_results("registry", {
        "state_dict_bytes": size, "safetensors_bytes": stored, "reps": args.reps,
        "times_s": {**pair, **loads}, "medians_s": medians,
        "ratio_register_load_vs_save_load": roundtrip_ratio,
        "ratio_load_vs_torch_load": load_ratio, "note": NOISE_NOTE,
    })


if __name__ == "__main__":
    main()
