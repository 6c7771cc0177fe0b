"""How many rows a TF32 pass could prove exact (issue 13's exact W5 target, a route not built
yet): a row's TF32 label is the exact nearest center when its second-nearest TF32 distance
exceeds the nearest by more than the two centers' TF32 error bounds
(`kmeans_xp.testing.label_bounds.tf32_error`); the other rows would need an exact pass. Lloyd in
float64 on the CPU on W5-like blobs (probe_fused's data: k blobs, features on scales 1..90,
centers drawn from X), scaled down to n=100k, k=410 (W5's n/k = 244); per iteration, the
share of rows that cannot be proven, with the per-center bound and with the largest center
norm for every center (what a kernel without per-column bounds would use).

    python benchmarks/tf32_certify_probe.py [OUT.json]
"""
from __future__ import annotations

import json
import sys

import numpy as np

from kmeans_xp.testing.label_bounds import tf32_error


def w5_like(n, d, k, seed=0):
    rs = np.random.RandomState(seed)
    scales = 1.0 + np.arange(d, dtype=np.float32) * 0.7
    blobs = rs.uniform(-10, 10, (k, d)).astype(np.float32) * scales + np.arange(d) * 3
    X = blobs[rs.randint(0, k, n)] + rs.standard_normal((n, d)).astype(np.float32) * scales * 0.8
    X = (X - X.mean(axis=0)).astype(np.float32)
    init = X[np.random.default_rng(seed).choice(n, k, replace=False)].copy()
    return X, init


def unprovable(X, C):
    """(share with per-center bounds, share with the largest center norm) of rows whose TF32
    label cannot be proven the exact nearest; the exact nearest labels."""
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    D = (C64 ** 2).sum(1)[None, :] - 2 * X64 @ C64.T
    two = np.argpartition(D, 1, axis=1)[:, :2]
    rows = np.arange(len(X))
    first = np.where(D[rows, two[:, 0]] <= D[rows, two[:, 1]], two[:, 0], two[:, 1])
    second = np.where(first == two[:, 0], two[:, 1], two[:, 0])
    gap = D[rows, second] - D[rows, first]
    per_center = gap <= tf32_error(X, C, first) + tf32_error(X, C, second)
    widest = np.full(len(X), int(np.argmax((C64 ** 2).sum(1))))
    largest = gap <= 2 * tf32_error(X, C, widest)
    return float(per_center.mean()), float(largest.mean()), first


def main(argv):
    n, d, k = 100_000, 128, 410
    X, C = w5_like(n, d, k)
    rows = []
    for it in range(8):
        per_center, largest, labels = unprovable(X, C)
        rows.append({"iteration": it, "unprovable_per_center": per_center,
                     "unprovable_largest_norm": largest})
        print(f"iteration {it}: {per_center:.4f} of rows unprovable (per-center bounds), "
              f"{largest:.4f} (largest norm)")
        w = np.bincount(labels, minlength=k).astype(np.float64)
        sums = np.zeros((k, d))
        np.add.at(sums, labels, X.astype(np.float64))
        C = np.where(w[:, None] > 0, sums / np.maximum(w, 1)[:, None], C).astype(np.float32)
    out = argv[1] if len(argv) > 1 else "tf32_certify_probe.json"
    with open(out, "w") as f:
        json.dump({"n": n, "d": d, "k": k, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
